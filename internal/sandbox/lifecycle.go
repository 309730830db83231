// The lifecycle of one run over a backend.Runtime: images checked,
// volumes made and filled, the disk cap and the timeout enforced, the
// launcher's signals heard at each step, what the sandbox wrote copied
// back, everything removed.

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/gatewayimage"
)

// Outcomes of a run a caller can branch on.
var (
	ErrImageMissing = errors.New("image not found on the engine")
	ErrTimeout      = errors.New("the sandbox ran out of time")
	ErrInterrupted  = errors.New("interrupted")
	// ErrCopyOut: what the sandbox wrote in a copied volume could not be
	// copied back to the host (and is gone with the volume).
	ErrCopyOut = errors.New("copying the sandbox's volume back failed")
)

// Budgets of the steps that must not hang a launcher forever.
const (
	removeBudget = 2 * time.Minute  // the teardown
	killBudget   = 30 * time.Second // a kill, or a signal's stop of an unstarted sandbox
	copyBudget   = 30 * time.Minute // the copies back
)

// RunOptions say how one sandbox runs.
type RunOptions struct {
	// TTY allocates a terminal (when the launcher's stdin and stdout are one).
	TTY bool
	// Interactive attaches the launcher's stdin.
	Interactive bool
	// Streams, where set, take the place of the launcher's streams: the
	// sandbox's output, and what the Runtime says while starting it, go
	// there.
	Streams backend.Streams
	// Build builds the image first when the project says how.
	Build bool
	// ImageChecked: the caller has just seen the agent's image on the
	// engine (preflight), so it is not looked up again.
	ImageChecked bool
	// Ran, when set, is called once the sandbox's command has run (exited,
	// or was stopped by the timeout or a signal), before the copies back.
	Ran func()
	// LookupEnv reads the launcher's environment for the variables the
	// project passes by name. Values stay in memory: they go to the engine
	// in the container's configuration and nowhere else.
	LookupEnv func(string) (string, bool)
	// Signals is where the run hears the launcher's signals; nil for the
	// process's own (SIGINT, SIGTERM and SIGHUP).
	Signals Signals
	// Keep, when set, makes the sandbox a persistent one (up, start, down):
	// started detached (or, made already, started again) and held by the
	// supervisor until it ends; stopped and kept (stop), it is neither
	// copied back nor removed.
	Keep *Keep
	// Started, when set, is called once the sandbox's container has been
	// started, with its name.
	Started func(container string)
	// Release, when set, may take over the removal of what the run made,
	// once its command has ended (its container has exited): it hands it to
	// a process of its own and reports true, or reports false, and the run
	// removes it before it returns.
	Release func(project string) bool
	// Host is where the engine listens, for what the run says when the
	// engine goes away.
	Host string
	// Broker, when set, is called once the project's gateway runs and
	// before the sandbox is made or started (it hands the gateway the
	// run's secrets, and the sandbox the gateway's CA): the gateway is
	// started alone first.
	Broker func(context.Context) error
}

// Signals delivers the launcher's signals to a run. Notify starts the
// delivery on c, and makes sure, called again, that it still goes on (an
// engine's client may reset the process's handlers); Stop ends it.
type Signals interface {
	Notify(c chan<- os.Signal)
	Stop(c chan<- os.Signal)
}

// processSignals are the process's SIGINT, SIGTERM and SIGHUP: caught, so
// that none of them kills the launcher before its teardown.
type processSignals struct{}

func (processSignals) Notify(c chan<- os.Signal) {
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
}
func (processSignals) Stop(c chan<- os.Signal) { signal.Stop(c) }

// Run starts the project's agent service as a one-off container attached
// to the launcher's streams, as `docker compose run --rm agent` does, and
// returns its exit code. Whatever happens (exit, error, signal, timeout),
// it then removes every container, network and volume of the project
// before returning.
//
// A signal before the container runs stops the start (exit code 128+n,
// ErrInterrupted); once it runs, the Runtime forwards signals to it; a
// signal during the teardown does not stop the teardown. The timeout kills
// it (124, ErrTimeout), and so does writing past its disk cap (122,
// *backend.DiskCapError).
func Run(ctx context.Context, rt backend.Runtime, project *types.Project, o RunOptions) (code int, err error) {
	// What the launcher applies itself is what the project says, in its
	// extension: the timeout, the changeset's copies (and the disk cap).
	ext, err := generator.ReadExtension(project)
	if err != nil && !errors.Is(err, generator.ErrNoExtension) {
		return 0, err
	}
	project, svc, err := prepare(project, o)
	if err != nil {
		return 0, err
	}
	r := &run{rt: rt, project: project, o: o, sigs: o.Signals, timeout: ext.Timeout, copies: copiesOf(ext)}
	if r.sigs == nil {
		r.sigs = processSignals{}
	}
	ctx = r.hearSignals(ctx)
	defer func() { code, err = r.teardown(code, err) }()

	uppers := volumeUppers(r.project)
	if !o.Keep.resuming() {
		// Made once: a persistent sandbox started again has its images,
		// and its volumes hold what it wrote.
		if err := r.ensureImages(ctx, svc); err != nil {
			return 0, err
		}
		if err := r.fillVolumes(ctx, svc); err != nil {
			return 0, err
		}
	}
	// The disk cap: a storage option where the engine enforces it, and
	// the launcher's watch on the rest, for as long as the sandbox runs.
	plan, err := r.planDisk(ctx, svc, uppers)
	if err != nil {
		return 0, err
	}
	if plan != nil && plan.StorageOpt != "" {
		svc.StorageOpt = map[string]string{"size": plan.StorageOpt}
	}
	project.Services[generator.Service] = svc
	w := &diskWatch{plan: plan, kill: r.kill}
	defer w.stop()

	var timedOut atomic.Bool
	if r.timeout > 0 {
		timer := time.AfterFunc(r.timeout, func() {
			timedOut.Store(true)
			r.kill()
		})
		defer timer.Stop()
	}

	if err := r.fenceFirst(ctx); err != nil {
		return 0, err
	}
	w.start()
	code, err = r.runOne(ctx)
	if err != nil && plan != nil && plan.StorageOpt != "" && errors.Is(err, backend.ErrStorageOptRefused) && ctx.Err() == nil {
		// The engine cannot cap the writable layer after all (its storage
		// was misjudged): the launcher watches it instead.
		w.stop()
		plan.WatchLayer()
		plan.StorageOpt = ""
		svc.StorageOpt = nil
		project.Services[generator.Service] = svc
		w.start()
		code, err = r.runOne(ctx)
	}
	if err == nil && o.Keep != nil {
		// A persistent sandbox runs until its supervisor lets it go; an
		// engine that comes back with it has it watched again.
		code, err = o.Keep.hold(ctx, r, w, func(ctx context.Context) error {
			p, perr := r.planDisk(ctx, svc, uppers)
			if perr != nil {
				return perr
			}
			w.plan = p
			w.start()
			return nil
		})
	}
	w.stop()
	// The Runtime may have reset the process's handlers: ours must be armed.
	r.sigs.Notify(r.sigc)
	return r.outcome(code, err, svc, timedOut.Load(), w.over.Load())
}

// planDisk says how the disk cap of svc holds, when it has one; nil when
// it has none.
func (r *run) planDisk(ctx context.Context, svc types.ServiceConfig, uppers map[string]string) (*backend.DiskPlan, error) {
	limit := generator.DiskCap(svc)
	if limit <= 0 {
		return nil, nil
	}
	return r.rt.PlanDisk(ctx, r.project, backend.DiskRequest{Service: generator.Service, Cap: limit, OverlayUppers: uppers})
}

// outcome copies back what the sandbox wrote, when its command ran, and
// says how the run ended: the command's exit code, or the launcher's
// reason to stop it. A persistent sandbox stopped and kept keeps what it
// wrote where it is.
func (r *run) outcome(code int, err error, svc types.ServiceConfig, timedOut bool, over *backend.DiskCapError) (int, error) {
	if err == nil || timedOut || over != nil {
		r.ended = true
		if r.o.Ran != nil {
			r.o.Ran()
		}
		var cerrs []error
		if !r.o.Keep.Kept() {
			cerrs = r.copyBack(svc)
		}
		if len(cerrs) > 0 {
			switch {
			case over != nil:
				code, err = backend.ExitDiskCap, over
			case timedOut:
				code = 124
			}
			return code, errors.Join(append([]error{err}, cerrs...)...)
		}
	}
	switch {
	case over != nil:
		return backend.ExitDiskCap, over
	case timedOut:
		return 124, fmt.Errorf("stopped after %s: %w", r.timeout, ErrTimeout)
	case err != nil && r.interrupted() != nil:
		s := r.interrupted()
		return 128 + int(s.(syscall.Signal)), fmt.Errorf("%w by %v while starting", ErrInterrupted, s)
	case err != nil && errors.Is(err, backend.ErrSubnetTaken):
		return 0, fmt.Errorf("running sandbox %s: %w: %v", r.project.Name, backend.ErrSubnetTaken, err)
	case err != nil:
		return 0, fmt.Errorf("running sandbox %s: %w", r.project.Name, err)
	}
	return code, nil
}

// run is one sandbox's run, between its steps.
type run struct {
	rt      backend.Runtime
	project *types.Project
	o       RunOptions
	timeout time.Duration        // stops the sandbox after this long; zero for none
	copies  []backend.VolumeCopy // fill volumes before the run, and copied back after it when the command ran

	cancel context.CancelFunc
	sigs   Signals
	sigc   chan os.Signal
	done   chan struct{} // closed when the signals are no longer heard
	heard  sync.WaitGroup
	sig    atomic.Value // the signal that stopped the start, if one did

	ended     bool                   // the command ran to its end: its container has exited
	container atomic.Pointer[string] // the sandbox's container's name, once started
}

// hearSignals hears the launcher's signals for the whole run, and returns
// the run's context, cancelled by a signal that stops the start.
//
// An engine's client may reset the process's handlers while it starts the
// container, and forwards signals to it once it runs; a signal before that
// would be lost (a container that is created but not started cannot be
// signalled), or take its default action and kill the launcher before its
// teardown. So the run keeps its own channel armed for the whole run,
// re-arming it often, and acts only on a sandbox that is not running yet.
func (r *run) hearSignals(ctx context.Context) context.Context {
	ctx, r.cancel = context.WithCancel(ctx)
	r.sigc = make(chan os.Signal, 16)
	r.done = make(chan struct{})
	r.sigs.Notify(r.sigc)
	r.heard.Add(1)
	go func() {
		defer r.heard.Done()
		rearm := time.NewTicker(20 * time.Millisecond)
		defer rearm.Stop()
		for {
			select {
			case s := <-r.sigc:
				r.stopStart(s)
			case <-rearm.C:
				r.sigs.Notify(r.sigc)
			case <-r.done:
				return
			}
		}
	}()
	return ctx
}

// stopStart stops the start on signal s, when the sandbox is not running
// yet: a running one has it from the Runtime.
func (r *run) stopStart(s os.Signal) {
	ctx, cancel := context.WithTimeout(context.Background(), killBudget)
	defer cancel()
	if r.rt.StopUnstarted(ctx, r.project.Name) {
		r.sig.CompareAndSwap(nil, s)
		r.cancel()
	}
}

// interrupted is the signal that stopped the start, or nil.
func (r *run) interrupted() os.Signal {
	s, _ := r.sig.Load().(os.Signal)
	return s
}

// teardown removes everything of the project, whatever happened, and says
// so in the run's outcome: a signal that stopped the start, a removal that
// failed.
func (r *run) teardown(code int, err error) (int, error) {
	// A signal during the teardown does not stop it: the channel stays
	// armed, unread, until the teardown is over.
	r.sigs.Notify(r.sigc)
	close(r.done)
	r.heard.Wait()
	r.cancel()
	var gone *EngineGoneError
	var rerr error
	if !r.o.Keep.Kept() {
		gone, rerr = r.remove()
	}
	r.sigs.Stop(r.sigc)
	if gone != nil {
		// A persistent sandbox's supervisor has said why it is gone (it
		// waited for the engine): that stands.
		if kept := (*GoneError)(nil); errors.As(err, &kept) {
			return code, err
		}
		// What the engine's client said as it lost it is not the news.
		return ExitEngineGone, gone
	}
	// A signal before the container ran shows as a cancelled context.
	if s := r.interrupted(); s != nil && (errors.Is(err, context.Canceled) || err == nil && code == 0) {
		code, err = 128+int(s.(syscall.Signal)), fmt.Errorf("%w by %v", ErrInterrupted, s)
	}
	if rerr != nil {
		err = errors.Join(err, fmt.Errorf("cleaning up sandbox %s: %w", r.project.Name, rerr))
	}
	return code, err
}

// remove removes everything of the project, or, once its command has
// ended, hands that over (Release), unless the engine has gone away: then
// all is left for the next run or gc to remove, and the run says what.
func (r *run) remove() (*EngineGoneError, error) {
	ctx, cancel := context.WithTimeout(context.Background(), removeBudget)
	defer cancel()
	if err := r.rt.Reachable(ctx); err != nil {
		return r.gone(err), nil
	}
	if r.ended && r.o.Release != nil && r.o.Release(r.project.Name) {
		return nil, nil
	}
	err := r.rt.Remove(ctx, r.project.Name, 0)
	if err != nil {
		// It may have gone away while it removed.
		if gerr := r.rt.Reachable(ctx); gerr != nil {
			return r.gone(gerr), nil
		}
	}
	return nil, err
}

// gone is the error of a run whose engine went away.
func (r *run) gone(err error) *EngineGoneError {
	name := ""
	if p := r.container.Load(); p != nil {
		name = *p
	}
	return engineGone(r.o.Host, r.project, name, err)
}

// fenceFirst starts the container that holds the agent's network
// namespace, when the project has one (generator.NetnsService: an
// allowlist on an engine whose internal networks do not keep the host
// out), and has it say that the namespace is fenced in before the agent
// joins it: the agent's first packet finds the fence. A persistent sandbox
// started again has its holder started, and its fence checked, by the
// Runtime's Start, before its agent.
func (r *run) fenceFirst(ctx context.Context) error {
	n, ok := r.project.Services[generator.NetnsService]
	if !ok || r.o.Keep.resuming() {
		return nil
	}
	p := *r.project
	p.Services = types.Services{generator.NetnsService: n}
	if err := r.rt.Up(ctx, &p); err != nil {
		return fmt.Errorf("starting the container that holds the sandbox's network namespace: %w", err)
	}
	var out strings.Builder
	code, err := r.rt.Exec(ctx, p.Name, backend.ExecSpec{Service: generator.NetnsService, Command: generator.FenceCheck(n, gatewayimage.Binary), Streams: backend.Streams{Out: &out, Err: &out}})
	switch {
	case err != nil:
		return fmt.Errorf("checking the fence of the sandbox's network namespace: %w", err)
	case code != 0:
		return fmt.Errorf("the sandbox's network namespace is not fenced in (exit %d): %s", code, strings.TrimSpace(out.String()))
	}
	return nil
}

// ensureImages fails fast, naming the image, when the agent's or the
// gateway's is not on the engine: propio-sandbox never pulls behind the
// user's back. With Build, the agent's is built when the project says how.
func (r *run) ensureImages(ctx context.Context, svc types.ServiceConfig) error {
	if !r.o.ImageChecked || r.o.Build {
		if err := r.ensureImage(ctx, svc, r.o.Build); err != nil {
			return err
		}
	}
	if gw, ok := r.project.Services[generator.GatewayService]; ok {
		if err := r.ensureImage(ctx, gw, false); err != nil {
			return fmt.Errorf("the allowlist gateway's %w", err)
		}
	}
	return nil
}

func (r *run) ensureImage(ctx context.Context, svc types.ServiceConfig, build bool) error {
	if build && svc.Build != nil {
		return buildImage(ctx, r.rt, r.project, svc.Name)
	}
	ok, err := r.rt.HasImage(ctx, svc.Image)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("image %s: %w", svc.Image, ErrImageMissing)
	}
	return nil
}

// fillVolumes makes the project's volumes (a changeset's), so that the
// teardown removes them by label, and fills those of the copies.
func (r *run) fillVolumes(ctx context.Context, svc types.ServiceConfig) error {
	if err := r.rt.CreateVolumes(ctx, r.project, svc.Image); err != nil {
		return err
	}
	for _, c := range r.copies {
		if err := r.rt.CopyIn(ctx, r.volume(svc, c), c.From); err != nil {
			return err
		}
	}
	return nil
}

// volume is the engine's volume of a copy, copied by helpers of the
// sandbox's image and labels.
func (r *run) volume(svc types.ServiceConfig, c backend.VolumeCopy) backend.Volume {
	return backend.Volume{Name: r.project.Volumes[c.Volume].Name, Image: svc.Image, Labels: svc.Labels}
}

// runOne runs the agent's container: attached, or, for a persistent
// sandbox, detached, or started again when it is made already.
func (r *run) runOne(ctx context.Context) (int, error) {
	if k := r.o.Keep; k.resuming() {
		return 0, k.start(ctx, r)
	}
	project, err := r.gatewayFirst(ctx)
	if err != nil {
		return 0, err
	}
	return r.rt.Run(ctx, project, backend.RunSpec{
		Service:     generator.Service,
		TTY:         r.o.TTY,
		Interactive: r.o.Interactive,
		Streams:     r.o.Streams,
		// A signal the Runtime forwarded to a sandbox not running yet.
		NotRunning: r.stopStart,
		Detach:     r.o.Keep != nil,
		Started: func(name string) {
			r.container.Store(&name)
			if r.o.Started != nil {
				r.o.Started(name)
			}
		},
	})
}

// gatewayFirst starts the project's gateway alone (made, or made already
// and started again), when the run has brokering to hand it (o.Broker),
// and hands it. It returns the project the sandbox runs in: without the
// gateway, which runs already, when it started it.
func (r *run) gatewayFirst(ctx context.Context) (*types.Project, error) {
	if r.o.Broker == nil {
		return r.project, nil
	}
	project := r.project
	if _, ok := r.project.Services[generator.GatewayService]; ok {
		gw := gatewayOnly(r.project)
		var err error
		if r.o.Keep.resuming() {
			err = r.rt.Start(ctx, gw)
		} else {
			err = r.rt.Up(ctx, gw)
		}
		if err != nil {
			return nil, err
		}
		project = agentOnly(r.project)
	}
	return project, r.o.Broker(ctx)
}

// kill stops the sandbox at once (its timeout, its disk cap).
func (r *run) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), killBudget)
	defer cancel()
	r.rt.Kill(ctx, r.project.Name)
}

// copyBack copies the copied volumes back to the host, each whatever
// became of the others. Not in the run's context: a signal that stopped
// the sandbox must not stop the copy of what it did.
func (r *run) copyBack(svc types.ServiceConfig) []error {
	ctx, cancel := context.WithTimeout(context.Background(), copyBudget)
	defer cancel()
	var errs []error
	for _, c := range r.copies {
		if c.To == "" {
			continue // a snapshot: nothing comes back
		}
		err := r.rt.CopyOut(ctx, r.volume(svc, c), c.To)
		switch {
		case err != nil && c.Volume == generator.GatewayLogVolumeKey:
			// Not what the sandbox wrote: its changeset stays whole.
			errs = append(errs, fmt.Errorf("copying the gateway's decision log back from the engine: %w", err))
		case err != nil:
			errs = append(errs, fmt.Errorf("%w: %w", ErrCopyOut, err))
		}
	}
	return errs
}

// diskWatch runs a disk plan's watch while the sandbox runs, and kills the
// sandbox when it goes over.
type diskWatch struct {
	plan  *backend.DiskPlan
	kill  func()
	over  atomic.Pointer[backend.DiskCapError]
	ended func() // ends the running watch and waits for it
}

func (w *diskWatch) start() {
	if w.plan == nil || w.plan.Watch == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		if o := w.plan.Watch(ctx); o != nil {
			w.over.Store(o)
			w.kill()
		}
	}()
	w.ended = func() { cancel(); <-ended }
}

// stop ends the watch, if one runs, and waits for it.
func (w *diskWatch) stop() {
	if w.ended != nil {
		w.ended()
		w.ended = nil
	}
}

// prepare copies the project, fills in the passed variables' values from the
// launcher's environment and labels everything with the launcher.
func prepare(project *types.Project, o RunOptions) (*types.Project, types.ServiceConfig, error) {
	p, err := project.WithServicesTransform(func(name string, s types.ServiceConfig) (types.ServiceConfig, error) { return s, nil })
	if err != nil {
		return nil, types.ServiceConfig{}, err
	}
	svc, ok := p.Services[generator.Service]
	if !ok {
		return nil, types.ServiceConfig{}, fmt.Errorf("project %s has no %s service", p.Name, generator.Service)
	}
	lookup := o.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	env := types.MappingWithEquals{}
	for k, v := range svc.Environment {
		if v != nil {
			env[k] = v
		} else if val, ok := lookup(k); ok {
			env[k] = &val
		}
	}
	svc.Environment = env
	p.Services[generator.Service] = svc
	launcher := launcherLabels(p.Name)
	if o.Keep != nil {
		o.Keep.project = project // as generated: no value of a passed variable
		maps.Copy(launcher, o.Keep.labels())
	}
	for name, s := range p.Services {
		s.Labels = withLabels(s.Labels, launcher)
		p.Services[name] = s
	}
	nets := types.Networks{}
	for name, n := range p.Networks {
		n.Labels = withLabels(n.Labels, launcher)
		nets[name] = n
	}
	p.Networks = nets
	vols := types.Volumes{}
	for name, v := range p.Volumes {
		if !v.External {
			v.Labels = withLabels(v.Labels, launcher)
		}
		vols[name] = v
	}
	p.Volumes = vols
	return p, p.Services[generator.Service], nil
}

// withLabels is a new map of labels and more.
func withLabels(labels, more types.Labels) types.Labels {
	out := types.Labels{}
	maps.Copy(out, labels)
	maps.Copy(out, more)
	return out
}

// launcherLabels tie a sandbox's resources to this launcher, for the
// teardown and for GC.
func launcherLabels(project string) types.Labels {
	host, _ := os.Hostname()
	return types.Labels{
		backend.LabelProject: project,
		backend.LabelPID:     strconv.Itoa(os.Getpid()),
		backend.LabelHost:    host,
	}
}

// volumeUppers maps the project's overlay volumes (a changeset's) to their
// upper directories, read from their driver options before CreateVolumes
// takes those off.
func volumeUppers(project *types.Project) map[string]string {
	out := map[string]string{}
	for key, v := range project.Volumes {
		if v.DriverOpts["type"] != "overlay" {
			continue
		}
		for _, o := range strings.Split(v.DriverOpts["o"], ",") {
			if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
				out[key] = dir
			}
		}
	}
	return out
}

// copiesOf are the copies a copy changeset makes, and a remote engine's
// snapshots (copied in only), as the extension says.
func copiesOf(ext generator.Extension) []backend.VolumeCopy {
	all := ext.Copies
	if ext.Changeset != nil {
		all = append(slices.Clone(ext.Changeset.Copies), all...)
	}
	var out []backend.VolumeCopy
	for _, c := range all {
		out = append(out, backend.VolumeCopy{Volume: c.Volume, From: c.In, To: c.Out})
	}
	return out
}
