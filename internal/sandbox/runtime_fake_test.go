package sandbox

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
)

// fakeRuntime is a backend.Runtime in memory. It records every call, in
// order, keeps the state of one sandbox (nothing, created, running,
// exited, removed), and lets a test decide what a step does: on[step] runs
// when the step is called, with the step's context, and its error is the
// step's. The steps are the Runtime's method names.
type fakeRuntime struct {
	t *testing.T

	mu     sync.Mutex
	calls  []string
	state  string // "", "created", "running", "exited", "removed"
	images map[string]bool
	// on[step] is what the step does besides being recorded.
	on map[string]func(ctx context.Context) error
	// created is what happens once the container is created, before it
	// starts; its error is Run's.
	created func(ctx context.Context, o backend.RunSpec) error
	// run is what the sandbox's container does once started; nil: exits 0.
	run func(ctx context.Context, o backend.RunSpec) (int, error)
	// plan is PlanDisk's answer.
	plan *backend.DiskPlan
	// sandboxes is List's answer.
	sandboxes []backend.Sandbox
	// facts is Facts' answer; subnets UsedSubnets'; overlay OverlayCapable's.
	facts   backend.Facts
	subnets []netip.Prefix
	overlay backend.Overlay

	killed    chan struct{} // closed by the first Kill
	stopAsked chan struct{} // closed by the first StopUnstarted
	runs      []*types.Project
	removeCtx []context.Context
	updates   []backend.Resources // UpdateResources' calls
	// relays are the relay containers started and not removed, by id;
	// relay, when set, is what one does once started.
	relays map[string]backend.Relay
	relay  func(id string, r backend.Relay)
	// ended is closed, with code set, when a detached (persistent)
	// sandbox's container stops: Stop, Kill, or the test's end.
	ended chan struct{}
	code  int
	// gone: the engine went away (goAway) while Wait waited.
	gone bool
}

var _ backend.Runtime = (*fakeRuntime)(nil)

func newFake(t *testing.T) *fakeRuntime {
	return &fakeRuntime{
		t:         t,
		images:    map[string]bool{agentImage: true, gatewayImage: true},
		facts:     backend.Facts{Kind: "fake", Host: "fake://", InternalNetworks: true},
		on:        map[string]func(context.Context) error{},
		killed:    make(chan struct{}),
		stopAsked: make(chan struct{}),
	}
}

const (
	agentImage   = "example/agent:1"
	gatewayImage = "example/gateway:1"
)

// step records a call and does what the test said it does.
func (f *fakeRuntime) step(ctx context.Context, name string, args ...any) error {
	f.mu.Lock()
	call := strings.TrimSpace(fmt.Sprintln(append([]any{name}, args...)...))
	f.calls = append(f.calls, call)
	do := f.on[name]
	f.mu.Unlock()
	if do != nil {
		return do(ctx)
	}
	return nil
}

// called lists the calls made, by step name only.
func (f *fakeRuntime) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		name, _, _ := strings.Cut(c, " ")
		out = append(out, name)
	}
	return out
}

// count is how many times step was called.
func (f *fakeRuntime) count(step string) int {
	n := 0
	for _, c := range f.called() {
		if c == step {
			n++
		}
	}
	return n
}

func (f *fakeRuntime) setState(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state = s
}

func (f *fakeRuntime) Facts(ctx context.Context) (backend.Facts, error) {
	return f.facts, f.step(ctx, "Facts")
}

func (f *fakeRuntime) Info(ctx context.Context) (backend.Info, error) {
	return backend.Info{}, f.step(ctx, "Info")
}

func (f *fakeRuntime) ImageArch(ctx context.Context, ref string) (string, bool, error) {
	if err := f.step(ctx, "ImageArch", ref); err != nil {
		return "", false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return "amd64", f.images[ref], nil
}

func (f *fakeRuntime) HasImage(ctx context.Context, ref string) (bool, error) {
	if err := f.step(ctx, "HasImage", ref); err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.images[ref], nil
}

func (f *fakeRuntime) Build(ctx context.Context, project *types.Project, service string) error {
	return f.step(ctx, "Build", service)
}

// BuildImage reads the context, and has the image from then on.
func (f *fakeRuntime) BuildImage(ctx context.Context, tag string, buildContext io.Reader) error {
	if err := f.step(ctx, "BuildImage", tag); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, buildContext); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.images[tag] = true
	return nil
}

func (f *fakeRuntime) HasNetwork(ctx context.Context, name string) (bool, error) {
	return false, f.step(ctx, "HasNetwork", name)
}

func (f *fakeRuntime) UsedSubnets(ctx context.Context) ([]netip.Prefix, error) {
	return slices.Clone(f.subnets), f.step(ctx, "UsedSubnets")
}

func (f *fakeRuntime) ImageID(ctx context.Context, ref string) (string, error) {
	return "sha256:" + ref, f.step(ctx, "ImageID", ref)
}

func (f *fakeRuntime) ImageFile(ctx context.Context, image string, paths []string, max int64) (string, []byte, error) {
	return "", nil, f.step(ctx, "ImageFile", image)
}

func (f *fakeRuntime) PathExists(ctx context.Context, image, path string) (bool, error) {
	return false, f.step(ctx, "PathExists", image, path)
}

func (f *fakeRuntime) OverlayCapable(ctx context.Context) (backend.Overlay, error) {
	return f.overlay, f.step(ctx, "OverlayCapable")
}

func (f *fakeRuntime) ReleaseChangeset(ctx context.Context, id string) error {
	return f.step(ctx, "ReleaseChangeset", id)
}

func (f *fakeRuntime) UpdateResources(ctx context.Context, project, service string, r backend.Resources) error {
	f.mu.Lock()
	f.updates = append(f.updates, r)
	f.mu.Unlock()
	return f.step(ctx, "UpdateResources", project, service)
}

func (f *fakeRuntime) Exec(ctx context.Context, project string, o backend.ExecSpec) (int, error) {
	return 0, f.step(ctx, "Exec", project, o.Service)
}

func (f *fakeRuntime) CreateVolumes(ctx context.Context, project *types.Project, helperImage string) error {
	if err := f.step(ctx, "CreateVolumes"); err != nil {
		return err
	}
	vols := types.Volumes{}
	for k, v := range project.Volumes {
		if !v.External {
			v.Name, v.External, v.Driver, v.DriverOpts = project.Name+"_"+k, true, "", nil
		}
		vols[k] = v
	}
	project.Volumes = vols
	return nil
}

func (f *fakeRuntime) CopyIn(ctx context.Context, v backend.Volume, from string) error {
	return f.step(ctx, "CopyIn", v.Name, from)
}

func (f *fakeRuntime) CopyEntry(ctx context.Context, v backend.Volume, e backend.Entry) (backend.Copied, error) {
	return backend.Copied{}, f.step(ctx, "CopyEntry", v.Name, e.Name, e.From)
}

func (f *fakeRuntime) CopyOut(ctx context.Context, v backend.Volume, to string) error {
	return f.step(ctx, "CopyOut", v.Name, to)
}

func (f *fakeRuntime) PlanDisk(ctx context.Context, project *types.Project, d backend.DiskRequest) (*backend.DiskPlan, error) {
	if err := f.step(ctx, "PlanDisk", d.Service, d.Cap); err != nil {
		return nil, err
	}
	return f.plan, nil
}

// Run creates the container (state created), then, unless on["Run"]
// fails, starts it (state running) and runs f.run.
func (f *fakeRuntime) Run(ctx context.Context, project *types.Project, o backend.RunSpec) (int, error) {
	f.mu.Lock()
	seen := *project // as it is now: the launch may change it for another run
	seen.Services = maps.Clone(project.Services)
	f.runs = append(f.runs, &seen)
	f.state = "created"
	f.mu.Unlock()
	if err := f.step(ctx, "Run", o.Service); err != nil {
		return 0, err
	}
	if f.created != nil {
		if err := f.created(ctx, o); err != nil {
			return 0, err
		}
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	f.setState("running")
	if o.Started != nil {
		o.Started(project.Name + "-" + o.Service + "-run")
	}
	if o.Detach {
		f.mu.Lock()
		f.ended = make(chan struct{})
		f.mu.Unlock()
		return 0, nil
	}
	code, err := 0, error(nil)
	if f.run != nil {
		code, err = f.run(ctx, o)
	}
	f.setState("exited")
	return code, err
}

func (f *fakeRuntime) Up(ctx context.Context, project *types.Project) error {
	return f.step(ctx, "Up", project.Name)
}

func (f *fakeRuntime) Kill(ctx context.Context, project string) error {
	err := f.step(ctx, "Kill", project)
	f.end(137, "exited")
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.killed:
	default:
		close(f.killed)
	}
	return err
}

// StopUnstarted stops what is not running, as the engine does: true unless
// the container runs.
func (f *fakeRuntime) StopUnstarted(ctx context.Context, project string) bool {
	f.step(ctx, "StopUnstarted", project)
	f.mu.Lock()
	defer f.mu.Unlock()
	stopped := f.state != "running"
	if f.state == "created" {
		f.state = ""
	}
	select {
	case <-f.stopAsked:
	default:
		close(f.stopAsked)
	}
	return stopped
}

func (f *fakeRuntime) Remove(ctx context.Context, project string, launcher int) error {
	f.mu.Lock()
	f.removeCtx = append(f.removeCtx, ctx)
	f.mu.Unlock()
	err := f.step(ctx, "Remove", project, launcher)
	f.setState("removed")
	if err == nil {
		// What is removed is no longer listed.
		f.mu.Lock()
		f.sandboxes = slices.DeleteFunc(f.sandboxes, func(s backend.Sandbox) bool {
			return s.Project == project && (launcher == 0 || s.PID == launcher)
		})
		f.mu.Unlock()
	}
	return err
}

func (f *fakeRuntime) StartRelay(ctx context.Context, r backend.Relay) (string, error) {
	if err := f.step(ctx, "StartRelay", r.Project, r.Command); err != nil {
		return "", err
	}
	f.mu.Lock()
	if f.relays == nil {
		f.relays = map[string]backend.Relay{}
	}
	id := fmt.Sprintf("relay%d", len(f.calls))
	f.relays[id] = r
	do := f.relay
	f.mu.Unlock()
	if do != nil {
		do(id, r)
	}
	return id, nil
}

// Running is on["Running"]'s answer: running unless it fails.
func (f *fakeRuntime) Running(ctx context.Context, project, service string) (bool, error) {
	err := f.step(ctx, "Running", project, service)
	return err == nil, err
}

func (f *fakeRuntime) RemoveContainer(ctx context.Context, id string) error {
	f.mu.Lock()
	delete(f.relays, id)
	f.mu.Unlock()
	return f.step(ctx, "RemoveContainer", id)
}

// Reachable is on["Reachable"]'s answer: the engine is there unless it
// says otherwise.
func (f *fakeRuntime) Reachable(ctx context.Context) error {
	return f.step(ctx, "Reachable")
}

func (f *fakeRuntime) List(ctx context.Context) ([]backend.Sandbox, error) {
	if err := f.step(ctx, "List"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sandboxes), nil
}

// fakeSignals are the launcher's signals, sent by the test.
type fakeSignals struct {
	mu    sync.Mutex
	c     chan<- os.Signal
	armed bool // caught: a signal now would not kill the launcher
	stops int
}

func (s *fakeSignals) Notify(c chan<- os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.c, s.armed = c, true
}

func (s *fakeSignals) Stop(c chan<- os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed = false
	s.stops++
}

// reset is what an engine's client may do while it runs the container
// (the Compose SDK calls signal.Reset): the launcher's channel no longer
// gets the signals.
func (s *fakeSignals) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed = false
}

// send delivers sig as the process would: only while it is caught.
func (s *fakeSignals) send(t *testing.T, sig os.Signal) {
	t.Helper()
	s.mu.Lock()
	c, armed := s.c, s.armed
	s.mu.Unlock()
	if !armed {
		t.Errorf("%v sent while the launcher does not catch it: it would have killed the launcher", sig)
		return
	}
	select {
	case c <- sig:
	default:
		t.Errorf("%v dropped: the signal channel is full", sig)
	}
}

func (s *fakeSignals) isArmed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.armed
}

// waitDone waits for ctx to end, as a step that the launcher's stop
// cancels does, and fails the test when it does not within a while.
func waitDone(t *testing.T, ctx context.Context, what string) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Second):
		t.Errorf("%s: the step's context was not cancelled", what)
		return fmt.Errorf("%s: not cancelled", what)
	}
}

// testProject is a sandbox's project as the generator makes it: the agent,
// with a volume for a changeset's copy, a network and, with gateway, an
// allowlist's gateway.
func testProject(gateway bool) *types.Project {
	agent := types.ServiceConfig{Name: generator.Service}
	agent.Image = agentImage
	agent.Labels = types.Labels{generator.LabelProfile: "test"}
	agent.Environment = types.MappingWithEquals{"FIXED": ptr("1"), "PASSED": nil, "UNSET": nil}
	agent.Volumes = []types.ServiceVolumeConfig{{Type: types.VolumeTypeVolume, Source: "changeset-ws", Target: "/workspace"}}
	p := &types.Project{
		Name:     "propio-test-1",
		Services: types.Services{generator.Service: agent},
		Networks: types.Networks{"sandbox": {Name: "propio-test-1_sandbox"}},
		Volumes:  types.Volumes{"changeset-ws": {Labels: types.Labels{generator.LabelProfile: "test"}}, "shared": {External: true, Name: "shared"}},
	}
	if gateway {
		gw := types.ServiceConfig{Name: generator.GatewayService}
		gw.Image = gatewayImage
		gw.Labels = types.Labels{generator.LabelProfile: "test"}
		p.Services[generator.GatewayService] = gw
	}
	return p
}

// withDiskCap gives the project's agent a disk cap.
func withDiskCap(p *types.Project, limit int64) *types.Project {
	svc := p.Services[generator.Service]
	svc.Extensions = types.Extensions{generator.ExtensionKey: map[string]any{"profile": "test", "disk": limit}}
	p.Services[generator.Service] = svc
	return p
}

func ptr(s string) *string { return &s }

// withExtension says, in the project's extension, the copies of a copy
// changeset and the timeout (what the launch reads back from the project).
func withExtension(p *types.Project, copies []backend.VolumeCopy, timeout time.Duration) *types.Project {
	ext, _ := generator.ReadExtension(p) // a project without one: the zero extension
	ext.Timeout = timeout
	if len(copies) > 0 {
		cs := &generator.ExtensionChangeset{ID: "test", Mode: generator.ChangesetCopy}
		for _, c := range copies {
			cs.Copies = append(cs.Copies, generator.VolumeCopy{Volume: c.Volume, In: c.From, Out: c.To})
		}
		ext.Changeset = cs
	}
	svc := p.Services[generator.Service]
	ext.Set(&svc)
	p.Services[generator.Service] = svc
	return p
}

// end stops a detached sandbox's container with code, once, leaving it in
// state.
func (f *fakeRuntime) end(code int, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended == nil || f.state != "running" {
		return
	}
	f.state, f.code = state, code
	close(f.ended)
}

func (f *fakeRuntime) Container(ctx context.Context, project, service string) (string, error) {
	if err := f.step(ctx, "Container", project, service); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.state {
	case "running", "exited", "stopped":
		return "agent-1", nil
	}
	return "", nil
}

// Wait waits until a detached sandbox's container stops, unless on["Wait"]
// fails first (an engine that went away).
func (f *fakeRuntime) Wait(ctx context.Context, project, service string) (int, error) {
	if err := f.step(ctx, "Wait", project); err != nil {
		return 0, err
	}
	f.mu.Lock()
	ended := f.ended
	f.mu.Unlock()
	if ended == nil {
		return 0, fmt.Errorf("%s has no container to wait for", project)
	}
	select {
	case <-ended:
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.gone {
			f.gone = false
			return 0, goneError{}
		}
		return f.code, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (f *fakeRuntime) Start(ctx context.Context, project *types.Project) error {
	if err := f.step(ctx, "Start", project.Name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state != "running" {
		f.state = "running"
		f.ended = make(chan struct{})
	}
	return nil
}

func (f *fakeRuntime) Stop(ctx context.Context, project string) error {
	err := f.step(ctx, "Stop", project)
	f.end(0, "stopped")
	return err
}

// goAway is the engine going away while a detached sandbox runs: Wait
// fails with an error that is backend.ErrEngineGone, and the engine has
// stopped the container.
func (f *fakeRuntime) goAway() {
	f.mu.Lock()
	f.gone = true
	f.mu.Unlock()
	f.end(0, "stopped")
}

// goneError is an engine's error that is backend.ErrEngineGone.
type goneError struct{}

func (goneError) Error() string        { return "the engine does not answer" }
func (goneError) Is(target error) bool { return target == backend.ErrEngineGone }
