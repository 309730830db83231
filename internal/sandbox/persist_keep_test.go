package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// A persistent sandbox's hold over the fake runtime: how each of its ends
// leaves it (kept, removed, gone), what it records, and that it is started
// again when it is made already or its engine comes back.

// keptRun is a persistent sandbox held by Run in the background.
type keptRun struct {
	k     *Keep
	f     *fakeRuntime
	sigs  *fakeSignals // the supervisor's (stop, down)
	ready chan struct{}
	done  chan outcome
}

// holdSandbox runs p as a persistent sandbox on f (made, or, with rec,
// started again) until it ends, and waits until it runs.
func holdSandbox(t *testing.T, f *fakeRuntime, p *types.Project, idle time.Duration, rec *Record) *keptRun {
	t.Helper()
	dirs := hostinfo.Dirs{State: t.TempDir()}
	k := &Keep{Name: "test", ID: "id1", Record: rec, dirs: dirs, dir: keepDir(dirs, "test"), signals: &fakeSignals{}}
	if err := os.MkdirAll(k.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	k.rec = Record{Name: "test", ID: "id1", Project: p.Name, State: StateStarting, Supervisor: os.Getpid()}
	if rec != nil {
		os.WriteFile(filepath.Join(k.dir, projectFile), nil, 0o600)
	}
	kr := &keptRun{k: k, f: f, sigs: k.signals.(*fakeSignals), ready: make(chan struct{}), done: make(chan outcome, 1)}
	k.Ready = func(err error) {
		if err != nil {
			t.Errorf("Ready(%v)", err)
		}
		close(kr.ready)
	}
	svc := p.Services[generator.Service]
	ext, _ := generator.ReadExtension(p)
	ext.Keep = &generator.ExtensionKeep{Idle: idle}
	ext.Set(&svc)
	p.Services[generator.Service] = svc
	go func() {
		code, err := Run(context.Background(), f, p, RunOptions{Keep: k, Signals: &fakeSignals{}, LookupEnv: func(string) (string, bool) { return "", false }})
		k.finish(code, err)
		kr.done <- outcome{code: code, err: err}
	}()
	select {
	case <-kr.ready:
	case o := <-kr.done:
		t.Fatalf("the sandbox ended before it ran: %d, %v; calls %v", o.code, o.err, f.called())
	case <-time.After(20 * time.Second):
		t.Fatalf("the sandbox did not run; calls %v", f.called())
	}
	return kr
}

// end waits for the hold to end.
func (kr *keptRun) end(t *testing.T) outcome {
	t.Helper()
	select {
	case o := <-kr.done:
		return o
	case <-time.After(20 * time.Second):
		t.Fatalf("the hold did not end; calls %v", kr.f.called())
		return outcome{}
	}
}

// record is the sandbox's record as it is now.
func (kr *keptRun) record(t *testing.T) Record {
	t.Helper()
	r, err := readRecord(kr.k.dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestKeepEnds(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		end       func(t *testing.T, kr *keptRun)
		idle      time.Duration
		calls     []string // after Run's
		state     string
		why       string
		kept      bool
		copyBack  bool
		wantError bool
	}{
		"stop keeps it": {
			end: func(t *testing.T, kr *keptRun) {
				os.WriteFile(filepath.Join(kr.k.dir, stopFile), nil, 0o600)
				kr.sigs.send(t, syscall.SIGTERM)
			},
			calls: []string{"Stop"}, state: StateStopped, kept: true,
		},
		"down removes it": {
			end:   func(t *testing.T, kr *keptRun) { kr.sigs.send(t, syscall.SIGTERM) },
			calls: []string{"Stop", "CopyOut", "Reachable", "Remove"}, state: StateGone, why: "removed (down)", copyBack: true,
		},
		"idle removes it": {
			idle:  200 * time.Millisecond,
			end:   func(*testing.T, *keptRun) {},
			calls: []string{"Stop", "CopyOut", "Reachable", "Remove"}, state: StateGone, why: "resources.idle (200ms)", copyBack: true,
		},
		"its main process ends": {
			end:   func(t *testing.T, kr *keptRun) { kr.f.end(0, "exited") },
			calls: []string{"CopyOut", "Reachable", "Remove"}, state: StateGone, why: "its main process ended (exit 0)", copyBack: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			kr := holdSandbox(t, f, withExtension(testProject(false), copies, 0), tc.idle, nil)
			if r := kr.record(t); r.State != StateRunning || r.Container != "agent-1" {
				t.Errorf("record while it runs: %+v", r)
			}
			tc.end(t, kr)
			o := kr.end(t)
			if (o.err != nil) != tc.wantError {
				t.Errorf("Run = %d, %v", o.code, o.err)
			}
			calls := f.called()
			i := slices.Index(calls, "Run")
			if i < 0 || !slices.Equal(withoutWaits(calls[i+1:]), tc.calls) {
				t.Errorf("calls %v, want Run, then %v", calls, tc.calls)
			}
			if kr.k.Kept() != tc.kept {
				t.Errorf("kept %v, want %v", kr.k.Kept(), tc.kept)
			}
			r := kr.record(t)
			if r.State != tc.state || !strings.Contains(r.Why, tc.why) || r.Supervisor != 0 {
				t.Errorf("record %+v: want state %s, why %q, no supervisor", r, tc.state, tc.why)
			}
		})
	}
}

// withoutWaits are the calls but those a hold makes while it waits.
func withoutWaits(calls []string) []string {
	return slices.DeleteFunc(slices.Clone(calls), func(c string) bool {
		return c == "Wait" || c == "Container" || c == "Facts" || c == "PlanDisk"
	})
}

// An exec running keeps the sandbox past its idle timeout; once it ends,
// the sandbox is idle again for the whole timeout before it goes.
func TestKeepIdleWaitsForExec(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	kr := holdSandbox(t, f, testProject(false), 150*time.Millisecond, nil)
	busy, err := os.OpenFile(filepath.Join(kr.k.dir, busyFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(busy.Fd()), syscall.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	held := time.Now()
	select {
	case o := <-kr.done:
		t.Fatalf("removed while an exec ran: %v", o)
	case <-time.After(600 * time.Millisecond):
	}
	busy.Close()
	kr.end(t)
	if f.count("Remove") != 1 || !strings.Contains(kr.record(t).Why, "resources.idle") {
		t.Errorf("after the exec: calls %v, record %+v", f.called(), kr.record(t))
	}
	if time.Since(held) < 600*time.Millisecond+150*time.Millisecond {
		t.Errorf("removed %s after the exec began: not a whole idle period after it ended", time.Since(held))
	}
}

// A sandbox made already is started again, not made: no image looked up,
// no volume made or filled.
func TestKeepResume(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.setState("stopped")
	kr := holdSandbox(t, f, withExtension(testProject(false), copies, 0), 0, &Record{Name: "test", ID: "id1", Project: "propio-test-1", State: StateStopped})
	kr.sigs.send(t, syscall.SIGTERM)
	kr.end(t)
	calls := f.called()
	for _, c := range []string{"HasImage", "CreateVolumes", "CopyIn", "Run"} {
		if slices.Contains(calls, c) {
			t.Errorf("resume called %s: %v", c, calls)
		}
	}
	if !slices.Contains(calls, "Start") || !slices.Contains(calls, "CopyOut") || !slices.Contains(calls, "Remove") {
		t.Errorf("resume then down: calls %v", calls)
	}
}

// When the engine goes away, the supervisor waits for it: back with the
// sandbox's containers, it starts them again and holds on; back without
// them, or not back in time, the sandbox is gone, and why.
func TestKeepEngineGone(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		away       int    // Container calls that find the engine away
		containers bool   // the engine comes back with them
		why        string // "": back, running
		stop       bool   // stop is asked while the engine is away
	}{
		"back":              {away: 2, containers: true},
		"back without it":   {away: 1, containers: false, why: "without the sandbox's containers"},
		"not back":          {away: 1 << 30, why: "did not come back within"},
		"stopped meanwhile": {away: 1 << 30, stop: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			kr := holdSandbox(t, f, testProject(false), 0, nil)
			kr.k.engineWait = 300 * time.Millisecond
			var n int
			f.mu.Lock()
			f.on["Container"] = func(context.Context) error {
				if n++; n <= tc.away {
					return goneError{}
				}
				if !tc.containers {
					f.setState("removed")
				}
				return nil
			}
			f.mu.Unlock()
			if tc.stop {
				kr.k.engineWait = time.Minute
			}
			f.goAway()
			switch {
			case tc.stop:
				waitRecord(t, kr, StateRestarting, false)
				os.WriteFile(filepath.Join(kr.k.dir, stopFile), nil, 0o600)
				kr.sigs.send(t, syscall.SIGTERM)
			case tc.why == "":
				waitRecord(t, kr, StateRunning, true)
				kr.sigs.send(t, syscall.SIGTERM)
			}
			o := kr.end(t)
			r := kr.record(t)
			switch {
			case tc.stop && (o.err != nil || r.State != StateStopped || f.count("Remove") != 0 || f.count("Stop") != 0):
				t.Errorf("stopped while away: Run = %v, record %+v, calls %v", o.err, r, f.called())
			case !tc.stop && tc.why == "" && (o.err != nil || !slices.Contains(f.called(), "Start")):
				t.Errorf("back: Run = %v, calls %v", o.err, f.called())
			case !tc.stop && tc.why != "" && (r.State != StateGone || !strings.Contains(r.Why, tc.why) || f.count("Remove") != 1):
				t.Errorf("gone: record %+v, calls %v", r, f.called())
			}
		})
	}
}

// waitRecord waits (bounded) until the sandbox's record is in state, and,
// with started, the sandbox was started again.
func waitRecord(t *testing.T, kr *keptRun, state string, started bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for started && !slices.Contains(kr.f.called(), "Start") || kr.record(t).State != state {
		if time.Now().After(deadline) {
			t.Fatalf("the record is not %s: %+v; calls %v", state, kr.record(t), kr.f.called())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A start that fails leaves the sandbox as it was: stopped again, not
// removed, its record stopped and why.
func TestKeepStartFails(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.setState("stopped")
	f.on["Start"] = func(context.Context) error { return errors.New("no such network") }
	dirs := hostinfo.Dirs{State: t.TempDir()}
	rec := Record{Name: "test", ID: "id1", Project: "propio-test-1", State: StateStopped}
	k := &Keep{Record: &rec, dirs: dirs, dir: keepDir(dirs, "test"), rec: rec, signals: &fakeSignals{}}
	if err := os.MkdirAll(k.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	code, err := Run(context.Background(), f, testProject(false), RunOptions{Keep: k, Signals: &fakeSignals{}})
	k.finish(code, err)
	if err == nil || f.count("Remove") != 0 || f.count("Stop") != 1 {
		t.Errorf("Run = %v; calls %v: want the error, the start undone, nothing removed", err, f.called())
	}
	if r, _ := readRecord(k.dir); r.State != StateStopped || !strings.Contains(r.Why, "no such network") {
		t.Errorf("record %+v", r)
	}
}
