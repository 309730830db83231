package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/compose/v5/pkg/api"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	mobysignal "github.com/moby/sys/signal"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/diskcap"
)

// RunOptions say how one sandbox runs.
type RunOptions struct {
	// TTY allocates a terminal (when the launcher's stdin and stdout are one).
	TTY bool
	// Interactive attaches the launcher's stdin.
	Interactive bool
	// Timeout stops the sandbox after this long; zero for none.
	Timeout time.Duration
	// Build builds the image first when the project says how.
	Build bool
	// ImageChecked: the caller has just seen the agent's image on the
	// engine (preflight), so it is not looked up again.
	ImageChecked bool
	// Copies fill volumes of the project before the run and copy them back
	// after it (a changeset's copy realisation). The copies back are made
	// only when the sandbox's command ran.
	Copies []VolumeCopy
	// Ran, when set, is called once the sandbox's command has run (exited,
	// or was stopped by the timeout or a signal), before the copies back.
	Ran func()
	// LookupEnv reads the launcher's environment for the variables the
	// project passes by name. Values stay in memory: they go to the engine
	// in the container's configuration and nowhere else.
	LookupEnv func(string) (string, bool)
}

// Run starts the project's agent service as a one-off container with
// AutoRemove, attached to the launcher's streams, as `docker compose run --rm
// agent` does, and returns its exit code. Whatever happens (exit, error,
// signal, timeout), it then removes every container, network and volume of
// the project before returning.
func (e *Engine) Run(ctx context.Context, project *types.Project, o RunOptions) (code int, err error) {
	project, svc, err := prepare(project, o)
	if err != nil {
		return 0, err
	}

	// Signals. The SDK resets the process's handlers inside
	// RunOneOffContainer and forwards signals to the container once it runs;
	// a signal before that would be lost (a container that is created but not
	// started cannot be signalled), or take its default action and kill the
	// launcher before its teardown. So the launcher keeps its own channel
	// registered for the whole run, re-arming it after the SDK's reset, and
	// acts only on a sandbox that is not running yet.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var interrupted atomic.Value // the signal that stopped the start, if one did
	done := make(chan struct{})
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		rearm := time.NewTicker(20 * time.Millisecond)
		defer rearm.Stop()
		for {
			select {
			case s := <-sigs:
				if e.stopUnstarted(project.Name) {
					interrupted.CompareAndSwap(nil, s)
					cancel()
				}
			case <-rearm.C:
				signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
			case <-done:
				return
			}
		}
	}()

	// A signal the SDK forwards to a sandbox that is not running yet.
	e.api.onNotRunning(func(sig string) {
		if e.stopUnstarted(project.Name) {
			s, err := mobysignal.ParseSignal(sig)
			if err != nil {
				s = syscall.SIGINT
			}
			interrupted.CompareAndSwap(nil, os.Signal(s))
			cancel()
		}
	})
	defer e.api.onNotRunning(nil)

	defer func() {
		// The teardown always runs, and a signal during it does not stop it:
		// sigs stays registered, unread, until the teardown is over.
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		close(done)
		watch.Wait()
		cancel()
		tctx, tcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer tcancel()
		rerr := e.Remove(tctx, project.Name)
		signal.Stop(sigs)
		// A signal before the container ran shows as a cancelled context.
		if s, ok := interrupted.Load().(os.Signal); ok && (errors.Is(err, context.Canceled) || err == nil && code == 0) {
			code, err = 128+int(s.(syscall.Signal)), fmt.Errorf("%w by %v", ErrInterrupted, s)
		}
		if rerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up sandbox %s: %w", project.Name, rerr))
		}
	}()

	if !o.ImageChecked || o.Build {
		if err := e.ensureImage(ctx, project, svc, o.Build); err != nil {
			return 0, err
		}
	}
	if gw, ok := project.Services[generator.GatewayService]; ok {
		if err := e.ensureImage(ctx, project, gw, false); err != nil {
			return 0, fmt.Errorf("the allowlist gateway's %w", err)
		}
	}

	// The project's volumes (a changeset's), made here so that the
	// teardown removes them by label, and filled for a copy.
	uppers := overlayUppers(project)
	if err := e.createVolumes(ctx, project, svc.Image); err != nil {
		return 0, err
	}
	for _, c := range o.Copies {
		if err := e.copyIn(ctx, svc.Image, svc.Labels, project.Volumes[c.Volume].Name, c.From); err != nil {
			return 0, err
		}
	}

	// The disk cap: a storage option where the engine enforces it, and
	// the launcher's watch on the rest, for as long as the sandbox runs.
	plan, err := e.planDisk(ctx, project, &svc, uppers)
	if err != nil {
		return 0, err
	}
	project.Services[generator.Service] = svc
	var over atomic.Pointer[diskcap.Over]
	stopWatch := func() {}
	startWatch := func() {
		if plan == nil || len(plan.gauges()) == 0 {
			return
		}
		wctx, wcancel := context.WithCancel(context.Background())
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			if o := diskcap.Watch(wctx, plan.Cap, plan.gauges(), diskcap.DefaultTiming, nil); o != nil {
				over.Store(o)
				kctx, kcancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer kcancel()
				e.kill(kctx, project.Name)
			}
		}()
		stopWatch = sync.OnceFunc(func() { wcancel(); <-ended })
	}
	defer func() { stopWatch() }()

	var timedOut atomic.Bool
	if o.Timeout > 0 {
		timer := time.AfterFunc(o.Timeout, func() {
			timedOut.Store(true)
			kctx, kcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer kcancel()
			e.kill(kctx, project.Name)
		})
		defer timer.Stop()
	}

	runOne := func() (int, error) {
		return e.compose.RunOneOffContainer(ctx, project, api.RunOptions{
			Project: project,
			Service: generator.Service,
			// Podman before 4.6 reports exit code 0 to a wait for removal
			// (containers/podman#18889); the teardown below removes it anyway.
			AutoRemove:  e.Kind != Podman,
			Tty:         o.TTY,
			Interactive: o.Interactive,
			// The gateway of an allowlist sandbox starts first, and is removed
			// with the rest of the project below.
			NoDeps: len(project.Services) == 1,
		})
	}
	startWatch()
	code, err = runOne()
	if err != nil && plan != nil && plan.StorageOpt != "" && storageOptRefused(err) && ctx.Err() == nil {
		// The engine cannot cap the writable layer after all (its storage
		// was misjudged): the launcher watches it instead.
		stopWatch()
		plan.watchLayer(&svc)
		project.Services[generator.Service] = svc
		startWatch()
		code, err = runOne()
	}
	stopWatch()
	// The SDK stopped its own signal channel; ours must be the one armed.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	if err == nil || timedOut.Load() || over.Load() != nil {
		if o.Ran != nil {
			o.Ran()
		}
		// Not the run's context: a signal that stopped the sandbox must not
		// stop the copy of what it did.
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer ccancel()
		var cerrs []error
		for _, c := range o.Copies {
			if cerr := e.copyOut(cctx, svc.Image, svc.Labels, project.Volumes[c.Volume].Name, c.To); cerr != nil {
				cerrs = append(cerrs, fmt.Errorf("%w: %w", ErrCopyOut, cerr))
			}
		}
		if len(cerrs) > 0 {
			switch {
			case over.Load() != nil:
				code, err = ExitDiskCap, plan.overError(over.Load())
			case timedOut.Load():
				code = 124
			}
			return code, errors.Join(append([]error{err}, cerrs...)...)
		}
	}
	switch {
	case over.Load() != nil:
		return ExitDiskCap, plan.overError(over.Load())
	case timedOut.Load():
		return 124, fmt.Errorf("stopped after %s: %w", o.Timeout, ErrTimeout)
	case err != nil && interrupted.Load() != nil:
		s := interrupted.Load().(os.Signal)
		return 128 + int(s.(syscall.Signal)), fmt.Errorf("%w by %v while starting", ErrInterrupted, s)
	case err != nil && strings.Contains(err.Error(), "Pool overlaps"):
		return 0, fmt.Errorf("running sandbox %s: %w: %v", project.Name, ErrSubnetTaken, err)
	case err != nil:
		return 0, fmt.Errorf("running sandbox %s: %w", project.Name, err)
	}
	return code, nil
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
	for name, s := range p.Services {
		labels := types.Labels{}
		maps.Copy(labels, s.Labels)
		maps.Copy(labels, launcher)
		s.Labels = labels
		// The labels the Compose loader would add, by which the SDK finds
		// the containers it created (the gateway's, started before the run).
		s.CustomLabels = types.Labels{
			api.ProjectLabel:    p.Name,
			api.ServiceLabel:    name,
			api.VersionLabel:    api.ComposeVersion,
			api.WorkingDirLabel: p.WorkingDir,
			api.OneoffLabel:     "False",
		}
		p.Services[name] = s
	}
	svc = p.Services[generator.Service]
	nets := types.Networks{}
	for name, n := range p.Networks {
		labels := types.Labels{}
		maps.Copy(labels, n.Labels)
		maps.Copy(labels, launcher)
		n.Labels = labels
		nets[name] = n
	}
	p.Networks = nets
	return p, svc, nil
}

// Labels that tie a sandbox's resources to the launcher that made them.
const (
	LabelProject = "dev.propio-sandbox.project"
	LabelPID     = "dev.propio-sandbox.launcher-pid"
	LabelHost    = "dev.propio-sandbox.launcher-host"
)

func launcherLabels(project string) types.Labels {
	host, _ := os.Hostname()
	return types.Labels{
		LabelProject: project,
		LabelPID:     strconv.Itoa(os.Getpid()),
		LabelHost:    host,
	}
}

// ensureImage fails fast, naming the image, when it is not on the engine:
// propio-sandbox never pulls behind the user's back. With build, it builds
// the image when the project says how.
func (e *Engine) ensureImage(ctx context.Context, project *types.Project, svc types.ServiceConfig, build bool) error {
	if build && svc.Build != nil {
		return e.Build(ctx, project)
	}
	_, err := e.cli.Client().ImageInspect(ctx, svc.Image)
	if cerrdefs.IsNotFound(err) {
		return fmt.Errorf("image %s: %w", svc.Image, ErrImageMissing)
	}
	if err != nil {
		return fmt.Errorf("looking up image %s: %w", svc.Image, err)
	}
	return nil
}

// Build builds the image of the project's agent service, showing progress on
// the launcher's error stream.
func (e *Engine) Build(ctx context.Context, project *types.Project) error {
	svc, ok := project.Services[generator.Service]
	if !ok || svc.Build == nil {
		return fmt.Errorf("the profile has no build section: nothing to build")
	}
	err := e.compose.Build(ctx, project, api.BuildOptions{Services: []string{generator.Service}, Progress: "plain"})
	if err != nil {
		return fmt.Errorf("building %s: %w", svc.Image, err)
	}
	return nil
}

// kill stops the project's containers at once.
func (e *Engine) kill(ctx context.Context, project string) {
	list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
		Filters: make(client.Filters).Add("label", LabelProject+"="+project),
	})
	if err != nil {
		return
	}
	for _, c := range list.Items {
		e.cli.Client().ContainerKill(ctx, c.ID, client.ContainerKillOptions{Signal: "KILL"})
	}
}

// stopUnstarted handles a signal that reached the launcher: when the sandbox
// is not running yet (nothing created, or a container created but not
// started), it removes what there is and reports true, so the start stops.
// A running container gets the signal from the SDK, and is left alone.
func (e *Engine) stopUnstarted(project string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelProject+"="+project),
	})
	if err != nil {
		return true // cannot tell: stopping is the safe answer to a signal
	}
	stopped := true
	for _, c := range list.Items {
		if c.State != container.StateCreated {
			stopped = false
			continue
		}
		e.cli.Client().ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
	}
	return stopped
}
