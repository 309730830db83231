package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
)

// The pieces of a launch around the run, over a fake runtime: the name it
// takes, the leftovers it removes, what it refuses where the engine cannot
// do it, the gateway's image and a declared check's output.

// recorder is a Reporter that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	warns  []string
	notes  []string
	failed []error
}

func (r *recorder) Warn(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warns = append(r.warns, msg)
}

func (r *recorder) Note(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, msg)
}

func (r *recorder) Guarded([]string, string) {}

func (r *recorder) Failed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, err)
}

// testEnv is a workspace and the launcher's directories, all new.
func testEnv(t *testing.T) Env {
	t.Helper()
	tmp := t.TempDir()
	ws := filepath.Join(tmp, "My Project")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	dirs := hostinfo.Dirs{Config: filepath.Join(tmp, "config"), State: filepath.Join(tmp, "state")}
	return Env{Dirs: dirs, Workspace: ws, Locs: profile.Locations{ConfigDir: dirs.ProfileDir(), Workspace: ws}}
}

// fakeLaunch is a launch of p in a new workspace over f, named as render
// names it, as Launch.Run makes one once preflight has passed.
func fakeLaunch(t *testing.T, f *fakeRuntime, p *profile.Profile) (*launch, *recorder) {
	t.Helper()
	env := testEnv(t)
	rec := &recorder{}
	s := &launch{Launch: &Launch{Env: env, Profile: p, Report: rec}, report: rec, rt: f, facts: f.facts, gcDone: make(chan struct{})}
	s.opts = generator.Options{Project: generator.ProjectName(env.Workspace, "")}
	s.adjust = append(s.adjust, s.engineFacts)
	return s, rec
}

// loadProfile loads a built-in profile as a launch does, in a new
// workspace.
func loadProfile(t *testing.T, name string) (*profile.Profile, Env) {
	t.Helper()
	env := testEnv(t)
	p, err := env.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	return p, env
}

// A name the engine's sandboxes hold (their launchers run) is passed over:
// the launch takes NAME-2, and removes nothing.
func TestNameHeldOnTheEngine(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	s, rec := fakeLaunch(t, f, &profile.Profile{})
	base := s.opts.Project
	f.sandboxes = []backend.Sandbox{{Project: base, Alive: true, PID: os.Getpid()}}
	names, err := namesOn(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	name, release, err := claimName(t.TempDir(), s.Env.Workspace, func(n string) bool { return names.held[n] })
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if name != base+"-2" {
		t.Errorf("name with %s held on the engine = %q, want %s-2", base, name, base)
	}
	s.opts.Project = name
	if err := s.reclaim(context.Background(), names); err != nil {
		t.Fatal(err)
	}
	if f.count("Remove") != 0 || len(s.reclaimed) != 0 {
		t.Errorf("a sandbox of a live launcher was removed: calls %v, reclaimed %v", f.called(), s.reclaimed)
	}
	if len(rec.warns)+len(rec.failed) > 0 {
		t.Errorf("said %v %v", rec.warns, rec.failed)
	}
}

// A sandbox of the name left by a killed launcher does not hold the name:
// the launch takes it, removes what that launcher left (only that: another
// launcher may be starting a sandbox of the name) before anything of its
// own is made, and says it removed a leftover (once, though the leftovers'
// collection runs too).
func TestNameLeftByAKilledLauncher(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	s, rec := fakeLaunch(t, f, &profile.Profile{})
	base := s.opts.Project
	host, _ := os.Hostname()
	dead := deadPID(t)
	f.sandboxes = []backend.Sandbox{{Project: base, Alive: false, PID: dead, Host: host}}
	ctx := context.Background()
	names, err := namesOn(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	name, release, err := claimName(t.TempDir(), s.Env.Workspace, func(n string) bool { return names.held[n] })
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if name != base {
		t.Fatalf("name with a killed launcher's %s on the engine = %q, want it", base, name)
	}
	if err := s.reclaim(ctx, names); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("Remove %s %d", base, dead); len(f.calls) == 0 || f.calls[len(f.calls)-1] != want {
		t.Errorf("calls %q: want what the killed launcher left removed, and only that (%s)", f.calls, want)
	}
	s.collectLeftovers(ctx, names)
	s.reportLeftovers(ctx)
	want := fmt.Sprintf("removed 1 leftover sandbox(es) of launchers that are gone: %s", base)
	if !slices.Equal(rec.notes, []string{want}) {
		t.Errorf("notes %q, want %q", rec.notes, want)
	}
	if n := f.count("Remove"); n != 1 {
		t.Errorf("Remove called %d times, want once; calls %q", n, f.calls)
	}
}

// Where the engine's facts say a network made internal does not keep the
// host out and it is older than the Podman whose fence is tested (4.3.1),
// an allowlist is refused before anything is made, naming both versions,
// and its declared checks are not run; from that version on, rootful or
// rootless, it is not refused.
func TestAllowlistRefusedWithoutInternalNetworks(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"4.3.1", "4.9.3", "5.0.0-rc1"} {
		for _, rootless := range []bool{false, true} {
			if allowlistRefused(backend.Facts{Kind: "podman", Rootless: rootless, Version: v}) {
				t.Errorf("Podman %s (rootless %v): allowlist refused", v, rootless)
			}
		}
	}
	f := newFake(t)
	f.facts.InternalNetworks = false
	f.facts.Rootless = true
	f.facts.Version = "4.2.1"
	p := &profile.Profile{Network: profile.Network{Mode: "allowlist"}}
	s, _ := fakeLaunch(t, f, p)
	code, err := s.run(context.Background(), engineNames{})
	if !errors.Is(err, ErrAllowlistOnPodman) || code != 0 || !strings.Contains(err.Error(), "needs Podman 4.3.1 or newer") || !strings.Contains(err.Error(), "(this engine: Podman 4.2.1)") {
		t.Errorf("run = %d, %v; want ErrAllowlistOnPodman naming 4.3.1 and 4.2.1", code, err)
	}
	for _, c := range f.called() {
		if c != "List" { // the leftovers' collection, and the guard's look at them
			t.Errorf("the refused launch asked the runtime %s", c)
		}
	}
	before := len(f.called())
	res := s.declaredCheck(context.Background(), profile.DeclaredCheck{Name: "unit", Run: []string{"true"}})
	if res.OK || !strings.HasPrefix(res.Reason, "not run: ") {
		t.Errorf("declared check = %+v, want not run", res)
	}
	if calls := f.called(); len(calls) > before {
		t.Errorf("the refused check asked the runtime: %v", calls[before:])
	}
}

// The gateway's image is made from this executable only when the engine
// does not have it, and the launch says so.
func TestGatewayImageBuiltOnlyWhenMissing(t *testing.T) {
	t.Parallel()
	for name, has := range map[string]bool{"present": true, "missing": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			const image = "example/gateway:new"
			f.images[image] = has
			s, rec := fakeLaunch(t, f, &profile.Profile{})
			if err := s.gatewayImage(context.Background(), image); err != nil {
				t.Fatal(err)
			}
			built := f.count("BuildImage")
			switch {
			case has && (built != 0 || len(rec.notes) != 0):
				t.Errorf("the engine has %s: built %d times, said %q", image, built, rec.notes)
			case !has && built != 1:
				t.Errorf("the engine lacks %s: built %d times, want once; calls %q", image, built, f.calls)
			case !has && (len(rec.notes) != 1 || !strings.HasPrefix(rec.notes[0], "making the gateway image "+image+" from ")):
				t.Errorf("notes %q: want one saying the image is made", rec.notes)
			}
			if ok, _ := f.HasImage(context.Background(), image); !ok {
				t.Errorf("the engine has no %s afterwards", image)
			}
		})
	}
}

// A declared check runs in a sandbox of its own whose output is kept off
// the launcher's streams, and the end of it is in the reason the check
// failed.
func TestDeclaredCheckKeepsItsOutput(t *testing.T) {
	t.Parallel()
	p, env := loadProfile(t, "offline")
	check := profile.DeclaredCheck{Name: "unit", Run: []string{"make", "test"}}
	p.Checks = append(p.Checks, check)
	plan, err := NewPlan(env, p)
	if err != nil {
		t.Fatal(err)
	}
	f := newFake(t)
	f.plan = &backend.DiskPlan{}
	f.run = func(ctx context.Context, o backend.RunSpec) (int, error) {
		if o.Streams.Out == nil || o.Streams.Err == nil || o.Interactive || o.TTY {
			t.Errorf("the check runs attached to the launcher: %+v", o)
			return 0, nil
		}
		io.WriteString(o.Streams.Out, "ok 1\n")
		io.WriteString(o.Streams.Err, "FAIL: TestThing\n")
		return 2, nil
	}
	rec := &recorder{}
	s := &launch{Launch: &Launch{Env: env, Profile: p, Report: rec}, report: rec, plan: plan, rt: f, facts: f.facts}
	s.opts = generator.Options{Project: generator.ProjectName(env.Workspace, "")}
	res := s.declaredCheck(context.Background(), check)
	if want := "[make test] exited 2:\nok 1\nFAIL: TestThing"; res.OK || res.Reason != want {
		t.Errorf("check = %v, %q; want failed, %q", res.OK, res.Reason, want)
	}
	if len(f.runs) != 1 || !strings.HasPrefix(f.runs[0].Name, generator.ProjectName(env.Workspace, "check-")) {
		t.Errorf("the check ran %d projects, want one of its own", len(f.runs))
	}
}

// An image to build (--build, or missing) is built before the profile's
// declared checks run it, once, and the run itself builds nothing.
func TestBuildBeforeDeclaredChecks(t *testing.T) {
	t.Parallel()
	p, env := loadProfile(t, "offline")
	p.Checks = append(p.Checks, profile.DeclaredCheck{Name: "unit", Run: []string{"make", "test"}})
	plan, err := NewPlan(env, p)
	if err != nil {
		t.Fatal(err)
	}
	f := newFake(t)
	f.plan = &backend.DiskPlan{}
	rec := &recorder{}
	s := &launch{Launch: &Launch{Env: env, Profile: p, Report: rec}, report: rec, plan: plan, rt: f, facts: f.facts, gcDone: make(chan struct{}), build: true}
	s.opts = generator.Options{Project: generator.ProjectName(env.Workspace, "")}
	if code, err := s.run(context.Background(), engineNames{}); code != 0 || err != nil {
		t.Fatalf("run = %d, %v", code, err)
	}
	var steps []string
	for _, c := range f.called() {
		if c == "Build" || c == "Run" {
			steps = append(steps, c)
		}
	}
	if want := []string{"Build", "Run", "Run"}; !slices.Equal(steps, want) {
		t.Errorf("builds and runs %q, want %q (the check's run, then the sandbox's); calls %q", steps, want, f.calls)
	}
}

// A launch ends as its sandbox's run does: the run's error and exit code
// are the launch's, with the agent's request server on or off (an error
// shadowed by the server's start was once lost, and the launcher said
// nothing of a timeout).
func TestLaunchKeepsTheRunsError(t *testing.T) {
	for _, requests := range [][]string{nil, {"resources"}} {
		p, env := loadProfile(t, "offline")
		p.AgentRequests = requests
		t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
		plan, err := NewPlan(env, p)
		if err != nil {
			t.Fatal(err)
		}
		f := newFake(t)
		f.plan = &backend.DiskPlan{}
		boom := errors.New("boom")
		f.run = func(context.Context, backend.RunSpec) (int, error) { return 0, boom }
		rec := &recorder{}
		s := &launch{Launch: &Launch{Env: env, Profile: p, Report: rec}, report: rec, plan: plan, rt: f, facts: f.facts, gcDone: make(chan struct{})}
		s.opts = generator.Options{Project: generator.ProjectName(env.Workspace, "")}
		if _, err := s.run(context.Background(), engineNames{}); !errors.Is(err, boom) {
			t.Errorf("agent_requests %v: launch error %v, want the run's", requests, err)
		}
	}
}
