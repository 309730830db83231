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

// TestFacts compares the facts the engine reports with what the docker CLI
// says of the same engine, and, when Podman runs here, with Podman's
// differences.
func TestFacts(t *testing.T) {
	ctx := context.Background()
	eng := connectEngine(t)
	facts, err := eng.Facts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := testenv.Docker("info", "--format", "{{.OperatingSystem}}|{{json .SecurityOptions}}")
	if err != nil {
		t.Fatal(err)
	}
	osName, secopts, _ := strings.Cut(strings.TrimSpace(out), "|")
	info, err := eng.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	podman := testenv.EnginePodman(t)
	want := backend.Facts{
		Kind:             map[bool]string{true: engine.Podman, false: engine.Docker}[podman],
		Host:             eng.Host,
		Rootless:         strings.Contains(secopts, "rootless") || eng.Rootless,
		DockerDesktop:    strings.Contains(osName, "Docker Desktop"),
		Local:            info.Storage.Local,
		StorageQuota:     info.Storage.Quota,
		StorageWhy:       info.Storage.Why,
		KeepID:           podman && eng.Rootless,
		PodmanTmpfs:      podman,
		HostGateway:      !podman,
		InternalNetworks: !podman,
	}
	if facts != want {
		t.Errorf("Facts = %+v\nwant    %+v", facts, want)
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
	if facts.Kind != engine.Podman || !facts.PodmanTmpfs || facts.HostGateway || facts.InternalNetworks || facts.KeepID || facts.Rootless {
		t.Errorf("rootful Podman's facts: %+v", facts)
	}
}
