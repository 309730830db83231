package engine

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// The info kept for an engine is given back only for the same engine
// process (identity) at the same address.
func TestEngineInfoKept(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	in := Info{Kind: Docker, Host: "unix:///run/a.sock", DataDir: "/var/lib/docker", Runtimes: []string{"runc", "runsc"}}
	if _, ok := cachedEngineInfo(in.Host, "pid 1 start 2"); ok {
		t.Fatal("an info was found before any was kept")
	}
	keepEngineInfo("pid 1 start 2", in)
	got, ok := cachedEngineInfo(in.Host, "pid 1 start 2")
	if !ok || got.DataDir != in.DataDir || strings.Join(got.Runtimes, ",") != "runc,runsc" {
		t.Fatalf("kept info = %+v, %v; want %+v", got, ok, in)
	}
	for _, c := range []struct{ host, identity string }{
		{in.Host, "pid 1 start 3"},              // the engine started again
		{in.Host, ""},                           // a process that cannot be named
		{"unix:///run/b.sock", "pid 1 start 2"}, // another address
	} {
		if _, ok := cachedEngineInfo(c.host, c.identity); ok {
			t.Errorf("info given for %s, %q: want it asked afresh", c.host, c.identity)
		}
	}
	// A torn or foreign file is no info.
	os.WriteFile(infoCacheFile(in.Host), []byte(`{"identity":"pid 1 start 2","info":`), 0o600)
	if _, ok := cachedEngineInfo(in.Host, "pid 1 start 2"); ok {
		t.Error("a torn cache file gave an info")
	}
}

// The identity of the process on a socket is its pid and start time, and
// it changes with a dockerd's configuration file.
func TestDaemonIdentity(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the engine process is named on Linux only")
	}
	sock := filepath.Join(t.TempDir(), "engine.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	// This test process is no engine: its socket's process is not named.
	if id := daemonIdentity(sock); id != "" {
		t.Fatalf("identity of a socket of the test's own = %q; want none: not an engine", id)
	}
	if got := daemonIdentity(filepath.Join(t.TempDir(), "none.sock")); got != "" {
		t.Errorf("identity of no socket = %q; want none", got)
	}
	// The tests' engine, when it is a dockerd of this host.
	if id := daemonIdentity("/var/run/docker.sock"); id != "" {
		if !strings.HasPrefix(id, "pid ") || !strings.Contains(id, " start ") || !strings.Contains(id, " config ") {
			t.Errorf("identity of the engine = %q; want its pid, start time and configuration file", id)
		}
		if again := daemonIdentity("/var/run/docker.sock"); again != id {
			t.Errorf("identity changed with nothing changed: %q, then %q", id, again)
		}
	}

	conf := filepath.Join(t.TempDir(), "daemon.json")
	for _, c := range []struct {
		cmdline string
		uid     uint32
		conf    string
		known   bool
	}{
		{"/usr/sbin/dockerd\x00-H\x00fd://\x00", 0, "/etc/docker/daemon.json", true},
		{"dockerd\x00--config-file\x00" + conf + "\x00", 0, conf, true},
		{"dockerd\x00--config-file=" + conf + "\x00", 1000, conf, true},
		{"dockerd\x00", 1000, "", false}, // rootless: its default is in its user's home
		{"/usr/bin/podman\x00system\x00service\x00", 1000, "", true},
		{"/lib/systemd/systemd\x00--system\x00", 0, "", false}, // listening for an engine it starts on demand
	} {
		got, known := daemonConfigFile([]byte(c.cmdline), c.uid)
		if got != c.conf || known != c.known {
			t.Errorf("daemonConfigFile(%q, %d) = %q, %v; want %q, %v", c.cmdline, c.uid, got, known, c.conf, c.known)
		}
	}
}

// The SDK's inspections of a one-off between its create and its start are
// answered with the engine's first; from its start on, the engine is asked.
func TestUnstartedInspectAsked(t *testing.T) {
	f := &inspectCounter{}
	c := &apiClient{APIClient: f}
	ctx := context.Background()
	res, err := c.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "p-agent-run-1", Config: &container.Config{Labels: map[string]string{"com.docker.compose.oneoff": "True", "com.docker.compose.project": "p"}}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		got, err := c.ContainerInspect(ctx, res.ID, client.ContainerInspectOptions{})
		if err != nil || got.Container.ID != res.ID || got.Container.State.Status != container.StateCreated {
			t.Fatalf("inspect = %+v, %v", got.Container, err)
		}
		got.Container.State.Status = "mangled" // a caller's copy is its own
	}
	if f.inspects != 1 {
		t.Errorf("the engine was asked %d times before the start; want once", f.inspects)
	}
	if _, err := c.ContainerStart(ctx, res.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ := c.ContainerInspect(ctx, res.ID, client.ContainerInspectOptions{})
	if f.inspects != 2 || got.Container.State.Status != container.StateRunning {
		t.Errorf("after the start: %d inspections, state %s; want the engine asked, running", f.inspects, got.Container.State.Status)
	}
}

// inspectCounter is an engine with one container, which counts inspections.
type inspectCounter struct {
	client.APIClient
	inspects int
	running  bool
}

func (f *inspectCounter) ContainerCreate(context.Context, client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	return client.ContainerCreateResult{ID: "c1"}, nil
}

func (f *inspectCounter) ContainerStart(context.Context, string, client.ContainerStartOptions) (client.ContainerStartResult, error) {
	f.running = true
	return client.ContainerStartResult{}, nil
}

func (f *inspectCounter) ContainerInspect(_ context.Context, id string, _ client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	f.inspects++
	state := container.StateCreated
	if f.running {
		state = container.StateRunning
	}
	raw := `{"Id":"` + id + `","State":{"Status":"` + string(state) + `"}}`
	res := client.ContainerInspectResult{Raw: []byte(raw)}
	res.Container.ID = id
	res.Container.State = &container.State{Status: state}
	return res, nil
}
