//go:build linux

package e2e

// A persistent sandbox when its engine goes away: back once the engine is
// (ls shows it running), or reported gone when it does not come back in
// time, never half there; up (and gc) then reap what it left. Against an
// engine of the test's own (testenv.PrivateDocker, or PrivatePodman when
// the tests run on Podman), never the shared one.

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// engineWaitInTests is how long the supervisors of these tests wait for
// their engine (PROPIO_SANDBOX_E2E_ENGINE_WAIT; EngineWait, 2m, otherwise).
const engineWaitInTests = 15 * time.Second

// privateEngine is an engine of the test's own, and a sandbox world that
// uses it.
func privateEngine(t *testing.T, images ...string) (*testenv.Engine, *sandbox) {
	t.Helper()
	requireEngine(t)
	var e *testenv.Engine
	if testenv.EnginePodman(t) {
		e = testenv.PrivatePodman(t)
	} else {
		e = testenv.PrivateDocker(t, images...)
	}
	s := makeSandbox(t)
	s.Env = append(s.Env, "DOCKER_HOST="+e.Host, "PROPIO_SANDBOX_E2E_ENGINE_WAIT="+engineWaitInTests.String())
	t.Cleanup(func() {
		if !e.Running() {
			e.Start()
		}
		s.Run("", "gc")
		label := "label=dev.propio-sandbox.workspace=" + s.Workspace
		for _, kind := range [][]string{{"ps", "-aq", "--filter", label}, {"network", "ls", "-q", "--filter", label}, {"volume", "ls", "-q", "--filter", label}} {
			if out, err := e.Docker(kind...); err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("left on the engine (%v): %v %s", kind, err, out)
			}
		}
	})
	return e, s
}

// waitState waits (bounded) until ls shows the sandbox in state.
func (p *persisted) waitState(t *testing.T, state string, limit time.Duration) lsEntry {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		e, ok := p.entry(t)
		if ok && e.State == state {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s is not %s after %s: %+v (listed %v)", p.name, state, limit, e, ok)
		}
		time.Sleep(100 * time.Millisecond) // the supervisor's own pace; no event reaches the test
	}
}

// TestPersistentEngineRestart: the engine stops (and, on Docker, is killed
// too); while it is away exec says so; once it is back the supervisor
// starts the sandbox again, as it was (its writable layer, the same
// container). An engine away for longer than the supervisor waits leaves
// the sandbox gone, with why; up then reaps what the engine kept of it.
func TestPersistentEngineRestart(t *testing.T) {
	t.Parallel()
	requireEngine(t)
	image := diskProbe(t, "ADD scratch.tar /")
	e, s := privateEngine(t, image)
	p := up(t, s, s.Profile("image: "+image+"\n"+probeOffline))
	probeOK(t, p.exec("", "/probe", "write", "/scratch/kept", "across restarts"), "wrote")
	agent := containerOf(t, e, p)

	restarts := []func(){e.Stop}
	if e.Kind == "docker" {
		restarts = append(restarts, e.Kill)
	}
	for i, away := range restarts {
		away()
		p.waitState(t, "restarting", time.Minute)
		if r := p.exec("", "/probe", "id"); r.Code != 125 || !strings.Contains(r.Stderr, "restarting") {
			t.Errorf("restart %d: exec while the engine is away:\n%s", i+1, r)
		}
		e.Start()
		p.waitState(t, "running", 2*time.Minute)
		probeOK(t, p.exec("", "/probe", "read", "/scratch/kept"), "across restarts")
		if id := containerOf(t, e, p); id != agent {
			t.Errorf("restart %d: the sandbox's container is %s, was %s", i+1, id, agent)
		}
	}

	// Away for longer than the supervisor waits: gone, never half there.
	e.Stop()
	p.waitState(t, "restarting", time.Minute)
	gone := p.waitState(t, "gone", engineWaitInTests+time.Minute)
	if !strings.Contains(gone.Why, "did not come back within "+engineWaitInTests.String()) {
		t.Errorf("gone, but why: %q", gone.Why)
	}
	if r := p.exec("", "/probe", "id"); r.Code != 125 || !strings.Contains(r.Stderr, "did not come back") {
		t.Errorf("exec in a sandbox that is gone:\n%s", r)
	}
	e.Start()
	// What the engine kept of it is a leftover that up reaps, as run and
	// gc do, before it starts the new one.
	again := up(t, s, s.Profile("image: "+image+"\n"+probeOffline))
	if ids, err := e.Docker("ps", "-aq", "--no-trunc", "--filter", "id="+agent); err != nil || strings.TrimSpace(ids) != "" {
		t.Errorf("up left the gone sandbox's container %s (%v): %s", agent, err, ids)
	}
	probeOK(t, again.exec("", "/probe", "id"), "cwd=/workspace")
}

// containerOf is the ID of the sandbox's agent container on e.
func containerOf(t *testing.T, e *testenv.Engine, p *persisted) string {
	t.Helper()
	out, err := e.Docker("ps", "-a", "--no-trunc", "--filter", "label=dev.propio-sandbox.project=propio-"+p.name, "--filter", "label=com.docker.compose.service=agent", "--format", "{{json .ID}}")
	if err != nil {
		t.Fatal(err)
	}
	var id string
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &id); err != nil {
		t.Fatalf("the sandbox's container: %v: %q", err, out)
	}
	return id
}
