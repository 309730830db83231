package sandbox

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/fsutil"
)

func TestPrepareKeep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value string
		set   bool
		want  time.Duration
		bad   bool
	}{
		{"", false, DefaultKeep, false},
		{"", true, DefaultKeep, false},
		{"0", true, 0, false},
		{"off", true, 0, false},
		{"OFF", true, 0, false},
		{"30m", true, 30 * time.Minute, false},
		{"90s", true, 90 * time.Second, false},
		{"25h", true, 0, true},
		{"-1m", true, 0, true},
		{"ten", true, 0, true},
		{"10", true, 0, true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Parallel()
			got, err := PrepareKeep(func(string) (string, bool) { return tc.value, tc.set })
			if (err != nil) != tc.bad || got != tc.want {
				t.Fatalf("PrepareKeep(%q) = %v, %v; want %v, error: %v", tc.value, got, err, tc.want, tc.bad)
			}
			if tc.bad && (!strings.Contains(err.Error(), EnvPrepare) || !strings.Contains(err.Error(), "off")) {
				t.Errorf("error %q: want the variable and what it takes", err)
			}
		})
	}
}

// A run on a prepared gateway runs its own container alone, on the
// keeper's network (external); the gateway's way out, which it does not
// join, is left out.
func TestAgentOnly(t *testing.T) {
	t.Parallel()
	p := testProject(true)
	p.Networks["outside"] = types.NetworkConfig{Name: "propio-test-1_outside", Internal: false}
	agent := p.Services[generator.Service]
	agent.Networks = map[string]*types.ServiceNetworkConfig{"sandbox": nil}
	agent.DependsOn = types.DependsOnConfig{generator.GatewayService: {Condition: "service_started", Required: true}}
	p.Services[generator.Service] = agent
	got := agentOnly(p)
	if _, ok := got.Services[generator.GatewayService]; ok || len(got.Services) != 1 {
		t.Errorf("services %v, want the agent alone", got.ServiceNames())
	}
	if d := got.Services[generator.Service].DependsOn; len(d) != 0 {
		t.Errorf("the agent still depends on %v", d)
	}
	if n, ok := got.Networks["sandbox"]; !ok || !bool(n.External) || n.Name != "propio-test-1_sandbox" {
		t.Errorf("sandbox network %+v, want the keeper's, external", n)
	}
	if _, ok := got.Networks["outside"]; ok {
		t.Error("the gateway's way out is in the run's project")
	}
	if _, ok := p.Services[generator.GatewayService]; !ok || len(p.Services[generator.Service].DependsOn) == 0 {
		t.Error("agentOnly changed the project it was given")
	}
}

// spareLaunch is a launch of an allowlist profile over f, its plan made
// and its directories its own, that may adopt a prepared gateway.
func spareLaunch(t *testing.T, f *fakeRuntime) *launch {
	t.Helper()
	p, env := loadProfile(t, "strict")
	rec := &recorder{}
	s := &launch{Launch: &Launch{Env: env, Profile: p, Report: rec}, report: rec, rt: f, facts: f.facts, gcDone: make(chan struct{}), keep: DefaultKeep}
	if err := s.prepare(); err != nil {
		t.Fatal(err)
	}
	return s
}

// inProcessKeeper keeps, in this process, the gateway s would make under
// name and subnet, ready, as a keeper process does (its name's lock held),
// serving on its socket; digest, when not "", is what it says it holds.
func inProcessKeeper(t *testing.T, s *launch, f *fakeRuntime, name, digest string) *keeper {
	t.Helper()
	subnet := netip.MustParsePrefix("198.18.77.0/24")
	_, mine, err := s.spareFor(name, subnet)
	if err != nil {
		t.Fatal(err)
	}
	if digest == "" {
		digest = mine
	}
	dir, err := backgroundDir(s.Env.Dirs)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(t.TempDir(), name+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	k := &keeper{
		spec: spareSpec{Project: name, Digest: digest, Subnet: subnet.String(), Workspace: s.Env.Workspace, Keep: time.Hour, State: s.Env.Dirs.State},
		dir:  dir, name: lock, rt: f, state: "ready", say: func(string, ...any) {},
		ready: make(chan struct{}), end: make(chan string, 1), removed: make(chan struct{}),
	}
	close(k.ready)
	ln, err := fsutil.ListenUnix(dir, name+".sock", 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); lock.Close() })
	go k.serve(ln)
	return k
}

// ended is why the keeper was told to remove its gateway, or "" when it
// was not (within a while).
func (k *keeper) ended(t *testing.T) string {
	t.Helper()
	select {
	case why := <-k.end:
		return why
	case <-time.After(5 * time.Second):
		return ""
	}
}

// The next run of the workspace adopts the gateway prepared for it: it
// holds its name by the lock the keeper shares, runs its container alone
// on the keeper's network, and begins the decision log the keeper made
// empty; no other launch adopts it then; the keeper removes all once the
// run is over.
func TestSpareAdopted(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	s := spareLaunch(t, f)
	name := generator.ProjectName(s.Env.Workspace, "") + "-2"
	k := inProcessKeeper(t, s, f, name, "")
	if _, err := os.Stat(s.Env.Dirs.LogDir()); err != nil {
		os.MkdirAll(s.Env.Dirs.LogDir(), 0o700)
	}
	os.WriteFile(filepath.Join(s.Env.Dirs.LogDir(), name+".jsonl"), nil, 0o600) // as the keeper prepares it

	a := s.adoptSpare(context.Background())
	if a == nil {
		t.Fatal("the prepared gateway was not adopted")
	}
	if a.name.Name != name {
		t.Errorf("adopted %s, want %s", a.name.Name, name)
	}
	// The adopter's descriptor is the keeper's lock: the name stays held
	// while either lives.
	var mine, keepers syscall.Stat_t
	if err := syscall.Fstat(int(a.name.file.Fd()), &mine); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(k.name.Name(), &keepers); err != nil {
		t.Fatal(err)
	}
	if mine.Ino != keepers.Ino || mine.Dev != keepers.Dev {
		t.Error("the adopter was not given the name's lock")
	}
	if err := syscall.Flock(int(a.name.file.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Errorf("the adopter's descriptor does not hold the lock the keeper took: %v", err)
	}
	if f.count("Running") != 1 {
		t.Errorf("the keeper did not look at its gateway before giving it: calls %v", f.called())
	}
	s.adopted = a
	s.opts.Project = a.name.Name
	project, _, err := s.adoptedProject(context.Background(), s.opts, s.engineFacts)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := project.Services[generator.GatewayService]; ok {
		t.Error("the run's project starts a gateway of its own")
	}
	if n := project.Networks["sandbox"]; !bool(n.External) || n.Name != name+"_sandbox" {
		t.Errorf("the run's network %+v, want the keeper's %s_sandbox", n, name)
	}
	if b, _ := os.ReadFile(filepath.Join(s.Env.Dirs.LogDir(), name+".jsonl")); !strings.Contains(string(b), `"event":"start"`) {
		t.Errorf("the decision log was not begun: %q", b)
	}
	if again := spareLaunch(t, f); again.adoptSpare(context.Background()) != nil {
		t.Error("a second launch adopted the gateway in use")
	}
	if !a.release() {
		t.Error("the keeper did not take the run's end")
	}
	if why := k.ended(t); !strings.Contains(why, "over") {
		t.Errorf("the keeper was told %q, want the run is over", why)
	}
}

// A prepared gateway that is not what the run would make (another profile,
// another build) is not adopted, and is removed; one whose gateway is not
// running is not adopted either; one of another workspace is left alone.
func TestSpareNotAdopted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		digest string
		setup  func(f *fakeRuntime, k *keeper)
		ended  string
	}{
		{"different", "0123", nil, "not what a launch"},
		{"not running", "", func(f *fakeRuntime, _ *keeper) {
			f.on["Running"] = func(context.Context) error { return errors.New("its gateway is not running") }
		}, "not running"},
		{"another workspace", "", func(_ *fakeRuntime, k *keeper) { k.spec.Workspace = "/elsewhere" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			s := spareLaunch(t, f)
			k := inProcessKeeper(t, s, f, generator.ProjectName(s.Env.Workspace, "")+"-2", tc.digest)
			if tc.setup != nil {
				tc.setup(f, k)
			}
			if a := s.adoptSpare(context.Background()); a != nil {
				t.Fatal("adopted")
			}
			if tc.ended == "" {
				select {
				case why := <-k.end:
					t.Errorf("the keeper was told to remove it: %s", why)
				default:
				}
				return
			}
			if why := k.ended(t); !strings.Contains(why, tc.ended) {
				t.Errorf("the keeper was told %q, want %q", why, tc.ended)
			}
		})
	}
}

// A launch that adopted a prepared gateway and is gone (killed) hangs up:
// its keeper removes all of the sandbox.
func TestSpareAdopterGone(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	s := spareLaunch(t, f)
	k := inProcessKeeper(t, s, f, generator.ProjectName(s.Env.Workspace, "")+"-2", "")
	a := s.adoptSpare(context.Background())
	if a == nil {
		t.Fatal("not adopted")
	}
	a.keeper.Close()
	if why := k.ended(t); !strings.Contains(why, "gone") {
		t.Errorf("the keeper was told %q, want the launcher is gone", why)
	}
}
