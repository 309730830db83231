package engine_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/testenv"
)

func TestFactsOf(t *testing.T) {
	t.Parallel()
	podman := backend.Facts{Kind: engine.Podman, TmpfsU: true, TmpfsCopyUp: true, NamesHost: true}
	rootless := podman
	rootless.Rootless, rootless.KeepID, rootless.UserSpaceGateway = true, true, true
	for name, tc := range map[string]struct {
		kind     string
		rootless bool
		want     backend.Facts
	}{
		"docker":          {engine.Docker, false, backend.Facts{Kind: engine.Docker, InternalNetworks: true}},
		"auto is docker":  {engine.Auto, false, backend.Facts{Kind: engine.Docker, InternalNetworks: true}},
		"podman":          {engine.Podman, false, podman},
		"rootless podman": {engine.Podman, true, rootless},
	} {
		if got := engine.FactsOf(tc.kind, tc.rootless); got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, got, tc.want)
		}
	}
}

// TestFacts compares the facts the engine reports with what the docker CLI
// says of the same engine.
func TestFacts(t *testing.T) {
	ctx := context.Background()
	eng := connectEngine(t)
	facts, err := eng.Facts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := testenv.Docker("info", "--format", "{{.OperatingSystem}}|{{json .SecurityOptions}}|{{.ServerVersion}}")
	if err != nil {
		t.Fatal(err)
	}
	osName, rest, _ := strings.Cut(strings.TrimSpace(out), "|")
	secopts, version, _ := strings.Cut(rest, "|")
	info, err := eng.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := engine.FactsOf(eng.Kind, eng.Rootless)
	if want.Kind != map[bool]string{true: engine.Podman, false: engine.Docker}[testenv.EnginePodman(t)] {
		t.Errorf("kind %s; docker version says otherwise", want.Kind)
	}
	want.Host = eng.Host
	// The API version the connection negotiated: the engine's (older than
	// the client's).
	api, err := testenv.Docker("version", "--format", "{{.Server.APIVersion}}")
	if err != nil {
		t.Fatal(err)
	}
	want.APIVersion = strings.TrimSpace(api)
	want.Rootless = strings.Contains(secopts, "rootless") || eng.Rootless
	want.DockerDesktop = strings.Contains(osName, "Docker Desktop")
	want.Local = info.Storage.Local
	want.StorageQuota, want.StorageWhy = info.Storage.Quota, info.Storage.Why
	want.DataDir = info.DataDir
	want.Remote, want.RemoteWhy = info.Remote, info.RemoteWhy
	want.Version = version
	if facts != want {
		t.Errorf("Facts = %+v\nwant    %+v", facts, want)
	}
	if strings.HasPrefix(eng.Host, "unix://") && facts.Remote {
		t.Errorf("an engine on a unix socket of this host is remote: %+v", facts)
	}
	if strings.HasPrefix(eng.Host, "unix://") && !facts.DockerDesktop && !facts.Local {
		t.Errorf("an engine on a unix socket of this host is not local: %+v", facts)
	}
}

// TestFactsPodman: Podman, when its service runs here, reports its
// differences from Docker.
func TestFactsPodman(t *testing.T) {
	const sock = "/run/podman/podman.sock"
	if _, err := os.Stat(sock); err != nil || os.Geteuid() != 0 {
		t.Skipf("no rootful Podman service at %s for this user", sock)
	}
	ctx := context.Background()
	eng, err := engine.Connect(ctx, "unix://"+sock, engine.Streams{Out: os.Stdout, Err: os.Stderr})
	if err != nil {
		t.Skipf("Podman at %s: %v", sock, err)
	}
	defer eng.Close()
	facts, err := eng.Facts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if facts.Kind != engine.Podman || !facts.TmpfsU || !facts.NamesHost || facts.InternalNetworks || facts.KeepID || facts.Rootless || facts.Version == "" {
		t.Errorf("rootful Podman's facts: %+v", facts)
	}
}
