package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
)

// outcome is what Run returned, and whether it said the command ran.
type outcome struct {
	code int
	err  error
	ran  bool
}

// copies is a changeset's copy of the workspace, into the volume and back.
var copies = []backend.VolumeCopy{{Volume: "changeset-ws", From: "/host/ws", To: "/host/changeset/ws"}}

// runOn runs p on f, hearing sigs, and checks what must hold however the
// run ends: it returns, its teardown (Remove) ran exactly once and last
// (but for looks at whether the engine is there), and the launcher no
// longer catches signals.
func runOn(t *testing.T, f *fakeRuntime, sigs *fakeSignals, p *types.Project, o RunOptions) outcome {
	t.Helper()
	out := runOnly(t, f, sigs, p, o)
	calls := slices.DeleteFunc(f.called(), func(c string) bool { return c == "Reachable" })
	teardown := slices.DeleteFunc(slices.Clone(f.calls), func(c string) bool { return c == "Reachable" })
	if n := f.count("Remove"); n != 1 {
		t.Errorf("Remove called %d times, want once; calls: %v", n, calls)
	} else if calls[len(calls)-1] != "Remove" {
		t.Errorf("Remove is not the last call; calls: %v", calls)
	} else if last := teardown[len(teardown)-1]; last != "Remove "+p.Name+" 0" {
		t.Errorf("the teardown asked %q, want all of the project: Remove %s 0", last, p.Name)
	}
	return out
}

// runOnly runs p on f, hearing sigs, and checks that it returns and that
// the launcher no longer catches signals.
func runOnly(t *testing.T, f *fakeRuntime, sigs *fakeSignals, p *types.Project, o RunOptions) outcome {
	t.Helper()
	var ran atomic.Bool
	o.Signals = sigs
	o.Ran = func() {
		if ran.Swap(true) {
			t.Error("Ran called twice")
		}
		if slices.Contains(f.called(), "CopyOut") {
			t.Error("Ran called after the copies back")
		}
	}
	if o.LookupEnv == nil {
		o.LookupEnv = func(string) (string, bool) { return "", false }
	}
	done := make(chan outcome, 1)
	go func() {
		code, err := Run(context.Background(), f, p, o)
		done <- outcome{code: code, err: err}
	}()
	var out outcome
	select {
	case out = <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("Run did not return; calls: %v", f.called())
	}
	out.ran = ran.Load()
	if sigs.isArmed() {
		t.Error("the launcher still catches signals after the run")
	}
	return out
}

// A run that goes well: the steps in order, the command's exit code as it
// is, what the sandbox gets (the passed variables, the launcher's labels),
// and the caller's project left as it was.
func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	for _, want := range []int{0, 1, 3, 137} {
		t.Run(strconv.Itoa(want), func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			f.run = func(context.Context, backend.RunSpec) (int, error) { return want, nil }
			p := testProject(true)
			lookup := func(k string) (string, bool) {
				if k == "PASSED" {
					return "s3cret", true
				}
				return "", false
			}
			out := runOn(t, f, &fakeSignals{}, withExtension(p, copies, 0), RunOptions{LookupEnv: lookup})
			if out.code != want || out.err != nil {
				t.Fatalf("Run = %d, %v; want %d, nil", out.code, out.err, want)
			}
			if !out.ran {
				t.Error("Ran was not called")
			}
			wantCalls := []string{"HasImage", "HasImage", "CreateVolumes", "CopyIn", "Run", "CopyOut", "Reachable", "Remove"}
			if got := f.called(); !slices.Equal(got, wantCalls) {
				t.Errorf("calls = %v, want %v", got, wantCalls)
			}
			ran := f.runs[0]
			agent := ran.Services[generator.Service]
			if v := agent.Environment["PASSED"]; v == nil || *v != "s3cret" {
				t.Errorf("PASSED = %v, want the launcher's value", v)
			}
			if _, ok := agent.Environment["UNSET"]; ok {
				t.Error("UNSET, unset on the launcher, is passed")
			}
			if v := agent.Environment["FIXED"]; v == nil || *v != "1" {
				t.Errorf("FIXED = %v, want 1", v)
			}
			pid := strconv.Itoa(os.Getpid())
			host, _ := os.Hostname()
			for what, labels := range map[string]types.Labels{
				"the agent": agent.Labels, "the gateway": ran.Services[generator.GatewayService].Labels,
				"the network": ran.Networks["sandbox"].Labels, "the volume": ran.Volumes["changeset-ws"].Labels,
			} {
				if labels[backend.LabelProject] != p.Name || labels[backend.LabelPID] != pid || labels[backend.LabelHost] != host {
					t.Errorf("%s's labels %v do not tie it to this launcher", what, labels)
				}
				if what != "the network" && labels[generator.LabelProfile] != "test" {
					t.Errorf("%s lost its own labels: %v", what, labels)
				}
			}
			if l := ran.Volumes["shared"].Labels; l[backend.LabelProject] != "" {
				t.Errorf("an external volume got the launcher's labels %v: the teardown would remove it", l)
			}
			if v := ran.Volumes["changeset-ws"]; !v.External || v.Name != p.Name+"_changeset-ws" {
				t.Errorf("the changeset's volume is %+v, want the one created", v)
			}
			// The caller's project is not the one run.
			if p.Services[generator.Service].Environment["PASSED"] != nil || p.Services[generator.Service].Labels[backend.LabelPID] != "" || p.Volumes["changeset-ws"].External {
				t.Error("Run changed the caller's project")
			}
		})
	}
}

// A signal before the container runs stops the start at whatever step it
// comes, with 128+n: nothing runs, nothing is copied back, everything is
// removed.
func TestRunSignalBeforeStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		step string
		sig  syscall.Signal
	}{
		{"HasImage", syscall.SIGINT}, // nothing created yet
		{"Build", syscall.SIGTERM},
		{"CreateVolumes", syscall.SIGINT},
		{"CopyIn", syscall.SIGHUP},
		{"PlanDisk", syscall.SIGINT},
	} {
		t.Run(tc.step, func(t *testing.T) {
			t.Parallel()
			f, sigs := newFake(t), &fakeSignals{}
			f.on[tc.step] = func(ctx context.Context) error {
				sigs.send(t, tc.sig)
				return waitDone(t, ctx, tc.step)
			}
			p := withDiskCap(testProject(false), 1<<20)
			svc := p.Services[generator.Service]
			svc.Build = &types.BuildConfig{Context: "."}
			p.Services[generator.Service] = svc
			out := runOn(t, f, sigs, withExtension(p, copies, 0), RunOptions{Build: tc.step == "Build"})
			if out.code != 128+int(tc.sig) || !errors.Is(out.err, ErrInterrupted) {
				t.Fatalf("Run = %d, %v; want %d, interrupted", out.code, out.err, 128+int(tc.sig))
			}
			if want := "interrupted by " + tc.sig.String(); out.err.Error() != want {
				t.Errorf("error %q, want %q", out.err, want)
			}
			if out.ran {
				t.Error("Ran was called for a sandbox that never ran")
			}
			for _, never := range []string{"Run", "CopyOut"} {
				if slices.Contains(f.called(), never) {
					t.Errorf("%s called after the signal; calls: %v", never, f.called())
				}
			}
			if f.count("StopUnstarted") != 1 {
				t.Errorf("StopUnstarted called %d times, want once", f.count("StopUnstarted"))
			}
		})
	}
}

// A signal once the container is created but not started, heard by the
// launcher or forwarded by the Runtime and lost on the container, stops
// the start.
func TestRunSignalWhileCreated(t *testing.T) {
	t.Parallel()
	for name, deliver := range map[string]func(*testing.T, *fakeSignals, backend.RunSpec){
		"heard":     func(t *testing.T, sigs *fakeSignals, _ backend.RunSpec) { sigs.send(t, syscall.SIGTERM) },
		"forwarded": func(_ *testing.T, _ *fakeSignals, o backend.RunSpec) { o.NotRunning(syscall.SIGTERM) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f, sigs := newFake(t), &fakeSignals{}
			f.created = func(ctx context.Context, o backend.RunSpec) error {
				deliver(t, sigs, o)
				return waitDone(t, ctx, "the created container")
			}
			f.run = func(context.Context, backend.RunSpec) (int, error) {
				t.Error("the container started after the signal")
				return 0, nil
			}
			out := runOn(t, f, sigs, withExtension(testProject(false), copies, 0), RunOptions{ImageChecked: true})
			if out.code != 143 || !errors.Is(out.err, ErrInterrupted) || !strings.Contains(out.err.Error(), "while starting") {
				t.Fatalf("Run = %d, %v; want 143, interrupted while starting", out.code, out.err)
			}
			if out.ran || slices.Contains(f.called(), "CopyOut") {
				t.Error("a sandbox that never ran was copied back")
			}
		})
	}
}

// A signal while the container runs is the container's (the Runtime
// forwards it): the launcher does not stop the run, and the command's exit
// code is the run's.
func TestRunSignalWhileRunning(t *testing.T) {
	t.Parallel()
	f, sigs := newFake(t), &fakeSignals{}
	f.run = func(ctx context.Context, _ backend.RunSpec) (int, error) {
		sigs.send(t, syscall.SIGINT)
		select {
		case <-f.stopAsked:
		case <-time.After(5 * time.Second):
			t.Error("the launcher did not hear the signal")
		}
		time.Sleep(50 * time.Millisecond)
		if ctx.Err() != nil {
			t.Error("the launcher cancelled a running sandbox on a signal")
		}
		return 130, nil // what the command made of SIGINT
	}
	out := runOn(t, f, sigs, withExtension(testProject(false), copies, 0), RunOptions{ImageChecked: true})
	if out.code != 130 || out.err != nil {
		t.Fatalf("Run = %d, %v; want 130, nil", out.code, out.err)
	}
	if !out.ran || f.count("CopyOut") != 1 {
		t.Errorf("a sandbox that ran was not copied back: ran %v, calls %v", out.ran, f.called())
	}
}

// A signal during the teardown does not stop it: the launcher catches it
// (it does not die of it), the teardown's context stays live, and the
// outcome is the command's.
func TestRunSignalDuringTeardown(t *testing.T) {
	t.Parallel()
	f, sigs := newFake(t), &fakeSignals{}
	f.run = func(context.Context, backend.RunSpec) (int, error) { return 7, nil }
	f.on["Remove"] = func(ctx context.Context) error {
		sigs.send(t, syscall.SIGINT)
		sigs.send(t, syscall.SIGTERM)
		time.Sleep(100 * time.Millisecond)
		if ctx.Err() != nil {
			t.Error("a signal cancelled the teardown")
		}
		return nil
	}
	out := runOn(t, f, sigs, testProject(false), RunOptions{ImageChecked: true})
	if out.code != 7 || out.err != nil {
		t.Fatalf("Run = %d, %v; want 7, nil", out.code, out.err)
	}
	if n := f.count("StopUnstarted"); n != 0 {
		t.Errorf("a signal during the teardown was acted on (%d StopUnstarted)", n)
	}
	if sigs.stops != 1 {
		t.Errorf("signals stopped %d times, want once, after the teardown", sigs.stops)
	}
}

// The Runtime may reset the process's handlers while it runs the container
// (the Compose SDK does): the launcher re-arms its own, while it runs and
// at once after.
func TestRunRearmsSignals(t *testing.T) {
	t.Parallel()
	f, sigs := newFake(t), &fakeSignals{}
	f.run = func(ctx context.Context, _ backend.RunSpec) (int, error) {
		sigs.reset()
		deadline := time.Now().Add(5 * time.Second)
		for !sigs.isArmed() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if !sigs.isArmed() {
			t.Error("the launcher did not re-arm its signals while the sandbox ran")
		}
		sigs.reset()
		return 0, nil
	}
	f.on["CopyOut"] = func(context.Context) error {
		if !sigs.isArmed() {
			t.Error("signals are not caught during the copies back")
		}
		return nil
	}
	out := runOn(t, f, sigs, withExtension(testProject(false), copies, 0), RunOptions{ImageChecked: true})
	if out.code != 0 || out.err != nil {
		t.Fatalf("Run = %d, %v", out.code, out.err)
	}
}

// The timeout kills the sandbox: 124, and what it wrote is copied back.
func TestRunTimeout(t *testing.T) {
	t.Parallel()
	for name, copyErr := range map[string]error{"": nil, "copy back fails": errors.New("disk full")} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			start := time.Now()
			f.run = func(ctx context.Context, _ backend.RunSpec) (int, error) {
				select {
				case <-f.killed:
					return 137, nil
				case <-time.After(10 * time.Second):
					t.Error("the timeout did not kill the sandbox")
					return 0, nil
				}
			}
			f.on["CopyOut"] = func(context.Context) error { return copyErr }
			out := runOn(t, f, &fakeSignals{}, withExtension(testProject(false), copies, 100*time.Millisecond), RunOptions{ImageChecked: true})
			if d := time.Since(start); d < 100*time.Millisecond {
				t.Errorf("stopped after %s, before its timeout", d)
			}
			if out.code != 124 {
				t.Errorf("exit code %d, want 124", out.code)
			}
			if copyErr == nil && (!errors.Is(out.err, ErrTimeout) || out.err.Error() != "stopped after 100ms: the sandbox ran out of time") {
				t.Errorf("error %v, want the timeout's", out.err)
			}
			if copyErr != nil && (!errors.Is(out.err, ErrCopyOut) || !errors.Is(out.err, copyErr)) {
				t.Errorf("error %v, want the failed copy's", out.err)
			}
			if !out.ran || f.count("CopyOut") != 1 {
				t.Errorf("a sandbox stopped by its timeout was not copied back: ran %v, calls %v", out.ran, f.called())
			}
		})
	}
}

// An error at any step ends the run with that error, after the teardown;
// what did not run is not copied back, and the steps after the failed one
// are not taken.
func TestRunErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		setup   func(f *fakeRuntime, p *types.Project, o *RunOptions)
		want    string // the error's text
		is      error  // one it wraps
		code    int
		ran     bool
		notCall string // a step that must not be taken
	}{
		{"image lookup", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) {
			f.on["HasImage"] = func(context.Context) error { return boom }
		},
			"boom", boom, 0, false, "CreateVolumes"},
		{"image missing", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) { f.images[agentImage] = false },
			"image example/agent:1: image not found on the engine", ErrImageMissing, 0, false, "CreateVolumes"},
		{"gateway image missing", func(f *fakeRuntime, _ *types.Project, o *RunOptions) {
			f.images[gatewayImage] = false
			o.ImageChecked = true
		},
			"the allowlist gateway's image example/gateway:1: image not found on the engine", ErrImageMissing, 0, false, "CreateVolumes"},
		{"build", func(f *fakeRuntime, p *types.Project, o *RunOptions) {
			f.on["Build"] = func(context.Context) error { return boom }
			svc := p.Services[generator.Service]
			svc.Build = &types.BuildConfig{Context: "."}
			p.Services[generator.Service] = svc
			o.Build = true
		}, "boom", boom, 0, false, "CreateVolumes"},
		{"volumes", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) {
			f.on["CreateVolumes"] = func(context.Context) error { return boom }
		},
			"boom", boom, 0, false, "CopyIn"},
		{"copy in", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) {
			f.on["CopyIn"] = func(context.Context) error { return boom }
		},
			"boom", boom, 0, false, "Run"},
		{"disk plan", func(f *fakeRuntime, p *types.Project, _ *RunOptions) {
			withDiskCap(p, 1<<20)
			f.on["PlanDisk"] = func(context.Context) error { return boom }
		}, "boom", boom, 0, false, "Run"},
		{"run", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) {
			f.on["Run"] = func(context.Context) error { return boom }
		},
			"running sandbox propio-test-1: boom", boom, 0, false, "CopyOut"},
		{"subnet taken", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) {
			f.on["Run"] = func(context.Context) error {
				return classifiedErr{"Pool overlaps with other one on this address space", backend.ErrSubnetTaken}
			}
		}, "running sandbox propio-test-1: the sandbox network's subnet is taken: Pool overlaps with other one on this address space", backend.ErrSubnetTaken, 0, false, "CopyOut"},
		{"command fails", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) {
			f.run = func(context.Context, backend.RunSpec) (int, error) { return 0, boom }
		}, "running sandbox propio-test-1: boom", boom, 0, false, "CopyOut"},
		{"copy back", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) {
			f.run = func(context.Context, backend.RunSpec) (int, error) { return 3, nil }
			f.on["CopyOut"] = func(context.Context) error { return boom }
		}, "copying the sandbox's volume back failed: boom", ErrCopyOut, 3, true, ""},
		{"teardown", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) {
			f.run = func(context.Context, backend.RunSpec) (int, error) { return 3, nil }
			f.on["Remove"] = func(context.Context) error { return boom }
		}, "cleaning up sandbox propio-test-1: boom", boom, 3, true, ""},
		{"teardown after an error", func(f *fakeRuntime, _ *types.Project, _ *RunOptions) {
			f.on["CopyIn"] = func(context.Context) error { return errors.New("copy in") }
			f.on["Remove"] = func(context.Context) error { return boom }
		}, "copy in\ncleaning up sandbox propio-test-1: boom", boom, 0, false, "Run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, p := newFake(t), withExtension(testProject(true), copies, 0)
			o := RunOptions{}
			tc.setup(f, p, &o)
			out := runOn(t, f, &fakeSignals{}, p, o)
			if out.err == nil || out.err.Error() != tc.want || !errors.Is(out.err, tc.is) {
				t.Fatalf("error %v, want %q wrapping %v", out.err, tc.want, tc.is)
			}
			if out.code != tc.code {
				t.Errorf("exit code %d, want %d", out.code, tc.code)
			}
			if out.ran != tc.ran {
				t.Errorf("Ran called: %v, want %v", out.ran, tc.ran)
			}
			if !tc.ran && slices.Contains(f.called(), "CopyOut") {
				t.Errorf("a sandbox that did not run was copied back; calls %v", f.called())
			}
			if tc.notCall != "" && slices.Contains(f.called(), tc.notCall) {
				t.Errorf("%s called after the failure; calls %v", tc.notCall, f.called())
			}
		})
	}
}

// classifiedErr is an engine's error that the Runtime classified.
type classifiedErr struct {
	msg  string
	kind error
}

func (c classifiedErr) Error() string        { return c.msg }
func (c classifiedErr) Is(target error) bool { return target == c.kind }

// Writing past the disk cap: the watch runs while the sandbox runs, kills
// it, and the run ends with 122 and where it wrote too much; what it wrote
// is copied back. The engine's storage option is set on the service.
func TestRunDiskCap(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var watching atomic.Int32
	f.plan = &backend.DiskPlan{Cap: 1 << 20, StorageOpt: "2048", Watch: func(ctx context.Context) *backend.DiskCapError {
		watching.Add(1)
		defer watching.Add(-1)
		// It writes too much once it runs.
		for ctx.Err() == nil {
			f.mu.Lock()
			state := f.state
			f.mu.Unlock()
			if state == "running" {
				return &backend.DiskCapError{Cap: 1 << 20, Where: backend.PlaceWorkspace, Size: 2 << 20}
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	}}
	f.run = func(ctx context.Context, _ backend.RunSpec) (int, error) {
		select {
		case <-f.killed:
			return 137, nil
		case <-time.After(10 * time.Second):
			t.Error("the disk watch did not kill the sandbox")
			return 0, nil
		}
	}
	out := runOn(t, f, &fakeSignals{}, withExtension(withDiskCap(testProject(false), 1<<20), copies, 0), RunOptions{ImageChecked: true})
	var over *backend.DiskCapError
	if out.code != backend.ExitDiskCap || !errors.As(out.err, &over) || over.Where != backend.PlaceWorkspace {
		t.Fatalf("Run = %d, %v; want 122 and the disk cap's error", out.code, out.err)
	}
	if !out.ran || f.count("CopyOut") != 1 {
		t.Errorf("a sandbox stopped at its disk cap was not copied back: ran %v, calls %v", out.ran, f.called())
	}
	if got := f.runs[0].Services[generator.Service].StorageOpt; got["size"] != "2048" {
		t.Errorf("storage_opt = %v, want the plan's size", got)
	}
	if watching.Load() != 0 {
		t.Error("the watch still runs after Run")
	}
}

// The engine refuses the storage option after all: the launcher runs the
// sandbox again without it, watching the writable layer instead.
func TestRunStorageOptRefused(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var layer atomic.Bool
	var watches, running atomic.Int32
	f.plan = &backend.DiskPlan{Cap: 1 << 20, StorageOpt: "2048",
		Watch: func(ctx context.Context) *backend.DiskCapError {
			watches.Add(1)
			running.Add(1)
			defer running.Add(-1)
			<-ctx.Done()
			return nil
		},
		WatchLayer: func() { layer.Store(true) },
	}
	refused := true
	f.on["Run"] = func(context.Context) error {
		if refused {
			refused = false
			return classifiedErr{"--storage-opt is supported only for overlay over xfs with 'pquota' mount option", backend.ErrStorageOptRefused}
		}
		return nil
	}
	f.run = func(context.Context, backend.RunSpec) (int, error) { return 5, nil }
	out := runOn(t, f, &fakeSignals{}, withDiskCap(testProject(false), 1<<20), RunOptions{ImageChecked: true})
	if out.code != 5 || out.err != nil {
		t.Fatalf("Run = %d, %v; want the second run's 5, nil", out.code, out.err)
	}
	if len(f.runs) != 2 || f.runs[0].Services[generator.Service].StorageOpt == nil || f.runs[1].Services[generator.Service].StorageOpt != nil {
		t.Fatalf("want a run with the storage option, then one without; runs: %d", len(f.runs))
	}
	if !layer.Load() {
		t.Error("the writable layer is not watched instead")
	}
	if watches.Load() != 2 || running.Load() != 0 {
		t.Errorf("watches started %d (want one for each run), %d still running", watches.Load(), running.Load())
	}
}

// The leftovers removed are the sandboxes of this host's launchers that
// are gone, and only what those launchers made; a removal that fails does
// not stop the others.
func TestRemoveLeftovers(t *testing.T) {
	t.Parallel()
	host, _ := os.Hostname()
	dead := deadPID(t)
	f := newFake(t)
	f.sandboxes = []backend.Sandbox{
		{Project: "alive", PID: os.Getpid(), Host: host},
		{Project: "killed", PID: dead, Host: host},
		{Project: "no-pid", PID: 0, Host: host},
		{Project: "elsewhere", PID: dead, Host: host + "-other"},
		{Project: "fails", PID: dead, Host: host},
	}
	f.on["Remove"] = func(context.Context) error {
		if strings.HasPrefix(f.calls[len(f.calls)-1], "Remove fails ") {
			return errors.New("busy")
		}
		return nil
	}
	list, err := f.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	removed, err := removeLeftovers(context.Background(), f, list)
	if want := []string{"killed", "no-pid"}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	if err == nil || err.Error() != "busy" {
		t.Errorf("error %v, want the failed removal's", err)
	}
	var asked []string
	for _, c := range f.calls {
		if p, ok := strings.CutPrefix(c, "Remove "); ok {
			asked = append(asked, p)
		}
	}
	d := strconv.Itoa(dead)
	if want := []string{"killed " + d, "no-pid 0", "fails " + d}; !slices.Equal(asked, want) {
		t.Errorf("Remove asked for %q, want %q (project, launcher)", asked, want)
	}
}

// deadPID is the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run true: %v", err)
	}
	return cmd.Process.Pid
}

// A leftover's ask directory (network.unlisted: ask) goes with it; a live
// launcher's stays.
func TestRemoveLeftoversAskDir(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	host, _ := os.Hostname()
	f := newFake(t)
	f.sandboxes = []backend.Sandbox{{Project: "alive", PID: os.Getpid(), Host: host}, {Project: "killed", PID: deadPID(t), Host: host}}
	base, err := ask.BaseDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"alive", "killed"} {
		if _, err := ask.Make(base, p, "/w"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := removeLeftovers(context.Background(), f, f.sandboxes); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(generator.AskDir(base, "killed")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed launcher's ask directory: %v; want it removed", err)
	}
	if _, err := os.Stat(generator.AskDir(base, "alive")); err != nil {
		t.Errorf("the live launcher's ask directory: %v", err)
	}
}
