package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// The launcher's fast path: the removal in the background, gateways
// prepared ahead, and the engine going away during a run.

// TestBackgroundRemoval: the launcher returns as soon as the sandbox's
// command has ended, while a background process removes its container (the
// removal is held here); while that process works, gc leaves the sandbox
// to it and ls shows it being removed; when it is killed during the
// removal, gc removes what it left. On Docker, on an engine of the test's
// own: the launchers of other builds sharing an engine would take the
// sandbox, whose launcher is gone, for theirs to remove.
func TestBackgroundRemoval(t *testing.T) {
	s := newSandbox(t)
	name := s.uniqueWorkspace()
	engine := engineSocket(t)
	observe := docker
	if !testenv.EnginePodman(t) {
		e := testenv.PrivateDocker(t, ProbeImage)
		engine, observe = strings.TrimPrefix(e.Host, "unix://"), e.Docker
	}
	px := cleanupStartProxyTo(t, engine, http.MethodDelete, "/containers/", holdRequest)
	s.Env = append(s.Env, "DOCKER_HOST=unix://"+px.socket)
	p := s.Profile("network: {mode: none}\n")
	if r := s.Run("", "run", "-p", p, "--", "exit", "0"); r.Code != 0 || r.OwnStderr() != "" {
		t.Fatalf("run:\n%s", r)
	}
	select {
	case <-px.seen:
	case <-time.After(time.Minute):
		t.Fatal("nothing removed the sandbox's container after the launcher returned")
	}
	// The launcher has returned; its container's removal is held.
	out, err := exec.Command("pgrep", "-f", "_background remove --host unix://"+px.socket).Output()
	pid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 0 {
		t.Fatalf("no background removal runs (%v): %q", err, out)
	}
	if states := sandboxStates(t, s); len(states) != 1 || states[0] != "removing" {
		t.Errorf("ls shows the workspace's sandboxes %v, want one removing", states)
	}
	if r := s.Run("", "gc"); r.Code != 0 || !strings.Contains(r.Stdout, "nothing to remove") {
		t.Errorf("gc touched what a background process removes:\n%s", r)
	}
	left := func() []string {
		out, err := observe("ps", "-aq", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(out)
	}
	if len(left()) == 0 {
		t.Fatal("the sandbox's container is gone while its removal is held")
	}
	// Killed during the removal: what it left is gc's.
	syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(time.Minute); syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the background removal outlived SIGKILL")
		}
	}
	if len(left()) == 0 {
		// On an engine shared with launchers of other builds, one of them
		// may take it, its launcher gone, for a leftover of theirs.
		t.Skip("another launcher on this engine removed the sandbox once its background removal was killed: gc has nothing to show")
	}
	if r := s.Run("", "gc"); r.Code != 0 || !strings.Contains(r.Stdout, "removed "+name) {
		t.Errorf("gc after the background removal was killed:\n%s", r)
	}
	if l := left(); len(l) > 0 {
		t.Errorf("left behind after gc: %v", l)
	}
}

// uniqueWorkspace moves the test's workspace to a directory of a name of
// its own, and returns its sandboxes' name: other tests' workspaces (of
// other builds, on a shared machine) take propio-workspace.
func (s *sandbox) uniqueWorkspace() string {
	s.t.Helper()
	ws := filepath.Join(filepath.Dir(s.Workspace), "ws-"+randomID())
	if err := os.Mkdir(ws, 0o755); err != nil {
		s.t.Fatal(err)
	}
	s.Workspace = ws
	return "propio-" + filepath.Base(ws)
}

// sandboxStates are the states ls gives the workspace's sandboxes.
func sandboxStates(t *testing.T, s *sandbox) []string {
	t.Helper()
	r := s.Run("", "ls", "--json")
	if r.Code != 0 {
		t.Fatalf("ls:\n%s", r)
	}
	var list []struct {
		Workspace, State string
	}
	if err := json.Unmarshal([]byte(r.Stdout), &list); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, r.Stdout)
	}
	var states []string
	for _, sb := range list {
		if sb.Workspace == s.Workspace {
			states = append(states, sb.State)
		}
	}
	return states
}

// TestEngineGoneDocker: the engine stops during an allowlist run (as its
// service manager stops it: SIGTERM). The launcher says so in one line
// naming what the sandbox left on it, exits 125 at once (no wait on a dead
// engine), and the next run, once the engine is back, removes it all.
func TestEngineGoneDocker(t *testing.T) {
	s := newSandbox(t)
	name := s.uniqueWorkspace()
	if testenv.EnginePodman(t) {
		t.Skip("stops a Docker engine of the test's own; TestEngineGonePodman stops Podman's service")
	}
	e := testenv.PrivateDocker(t, ProbeImage)
	s.Env = append(s.Env, "DOCKER_HOST="+e.Host)
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")
	l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	l.waitStdout(t, "ready", 2*time.Minute) // the gateway's image is made first
	stop := time.Now()
	e.Stop()
	r := l.wait(t, time.Minute)
	took := time.Since(stop)
	line := engineGoneLine(t, r, e.Host)
	for _, want := range []string{"sandbox " + name + ":", name + "-gateway-1", name + "_outside", name + "_sandbox", name + "-agent-run-"} {
		if !strings.Contains(line, want) {
			t.Errorf("the line does not name %s: %s", want, line)
		}
	}
	if took > 30*time.Second {
		t.Errorf("the launcher took %s to end once the engine had stopped", took)
	}
	t.Logf("the launcher ended %s after the engine's stop began", took.Round(time.Millisecond))
	e.Start()
	if left := privateLeftovers(t, e, s.Workspace); len(left) == 0 {
		t.Fatal("nothing is left on the engine back: the test shows nothing")
	}
	r = s.Run("", "run", "-p", p, "--", "exit", "0")
	if r.Code != 0 || !strings.Contains(r.Stderr, "removed 1 leftover sandbox(es) of launchers that are gone: "+name) {
		t.Fatalf("the next run:\n%s", r)
	}
	s.WaitBackground()
	if left := privateLeftovers(t, e, s.Workspace); len(left) > 0 {
		t.Errorf("left on the engine after the next run: %v", left)
	}
}

// TestEngineGonePodman: Podman's API service stops during a run; the
// sandbox's container runs on under conmon. The launcher says so in one
// line and exits 125; gc, through the service started again, removes the
// sandbox.
func TestEngineGonePodman(t *testing.T) {
	s := newSandbox(t)
	if !testenv.EnginePodman(t) {
		t.Skip("the engine is Docker: .ci/run runs this test on Podman")
	}
	name := s.uniqueWorkspace()
	e := testenv.PrivatePodman(t)
	s.Env = append(s.Env, "DOCKER_HOST="+e.Host)
	p := s.Profile("network: {mode: none}\n")
	l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	l.waitStdout(t, "ready", time.Minute)
	stop := time.Now()
	e.Stop()
	r := l.wait(t, time.Minute)
	took := time.Since(stop)
	if took > 30*time.Second {
		t.Errorf("the launcher took %s to end once the engine had stopped", took)
	}
	t.Logf("the launcher ended %s after the engine's stop began", took.Round(time.Millisecond))
	line := engineGoneLine(t, r, e.Host)
	if !strings.Contains(line, name+"-agent-run-") {
		t.Errorf("the line does not name the sandbox's container: %s", line)
	}
	if out, _ := docker("ps", "-q", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace); strings.TrimSpace(out) == "" {
		t.Error("the sandbox's container does not run on under conmon: the test shows less than it says")
	}
	e.Start()
	if r := s.Run("", "gc"); r.Code != 0 || !strings.Contains(r.Stdout, "removed "+name) {
		t.Errorf("gc:\n%s", r)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("left behind after gc: %v", left)
	}
}

// engineGoneLine checks that the launcher ended with exit code 125 and one
// error line that says the engine at host went away, and returns it.
func engineGoneLine(t *testing.T, r Result, host string) string {
	t.Helper()
	if r.Code != 125 {
		t.Errorf("exit code %d, want 125", r.Code)
	}
	var errs []string
	for _, l := range strings.Split(strings.TrimSpace(r.Stderr), "\n") {
		if !strings.HasPrefix(l, "propio-sandbox: making the gateway image") {
			errs = append(errs, l)
		}
	}
	if len(errs) != 1 || !strings.HasPrefix(errs[0], "propio-sandbox: error: the engine at "+host+" went away during the run") {
		t.Fatalf("want one line saying the engine went away:\n%s", r)
	}
	return errs[0]
}

// privateLeftovers lists what carries the workspace's label on the
// engine e.
func privateLeftovers(t *testing.T, e *testenv.Engine, workspace string) []string {
	t.Helper()
	var left []string
	for _, kind := range [][]string{{"ps", "-aq"}, {"network", "ls", "-q"}, {"volume", "ls", "-q"}} {
		out, err := e.Docker(append(kind, "--filter", "label=dev.propio-sandbox.workspace="+workspace)...)
		if err != nil {
			t.Fatal(err)
		}
		left = append(left, strings.Fields(out)...)
	}
	return left
}
