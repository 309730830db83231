package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/gatewayimage"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// Keep makes a Launch a persistent sandbox's supervisor: up makes the
// sandbox as run does, start starts a stopped one again, and either way the
// supervisor holds it, running, until it is stopped (stop: kept), removed
// (down), idle for resources.idle, past resources.timeout or its disk cap,
// or lost with its engine. What it holds it tears down as a run's launcher
// does.
type Keep struct {
	// Name is the sandbox's name (up --name); "" for the workspace's own.
	Name string
	// ID tells this sandbox from others of its name (NewKeepID).
	ID string
	// Log is the supervisors' log (KeepLog).
	Log string
	// Record is the sandbox's, for start; nil for up.
	Record *Record
	// Ready is told once the sandbox runs (nil), or why it could not be
	// made to (then nothing of it is left); nil: nobody is told.
	Ready func(error)

	dirs    hostinfo.Dirs
	dir     string   // the record's directory
	lock    *os.File // the supervisor's lock, held for its life
	rec     Record
	project *types.Project // as generated: project.yaml
	ready   bool
	kept    bool   // stopped, and kept
	why     string // why it ended by itself
	down    bool   // ending it is all there is to do (Down)
	// signals are what stop and down send the supervisor (SIGTERM); nil
	// for the process's own.
	signals Signals
	// engineWait is how long to wait for an engine that went away; zero for
	// engineWait().
	engineWait time.Duration
}

// resuming: the sandbox exists, its containers stopped or running (start,
// down).
func (k *Keep) resuming() bool { return k != nil && k.Record != nil }

// Kept reports whether the sandbox is kept: stopped by stop, or, started
// again (start), not running yet: a start that fails leaves it as it was.
func (k *Keep) Kept() bool {
	return k != nil && (k.kept || k.resuming() && !k.down && !k.ready)
}

// WasReady reports whether the sandbox ran (Ready was told so).
func (k *Keep) WasReady() bool { return k != nil && k.ready }

// claim takes the project name of the sandbox and makes its record: up's
// name (--name, or the workspace's as run takes it, NAME-2 while another
// holds NAME), or start's, exactly the record's. The name is held until
// release, and the record's directory by the supervisor's lock.
func (k *Keep) claim(dirs hostinfo.Dirs, l *Launch, names engineNames) (project string, release func(), err error) {
	k.dirs = dirs
	locks, err := namesDir()
	if err != nil {
		return "", nil, err
	}
	switch {
	case k.Record != nil:
		project, release, err = holdName(locks, k.Record.Project)
	case k.Name != "":
		project, release, err = claimExact(locks, projectOf(k.Name), func(n string) bool { return names.held[n] })
	default:
		project, release, err = claimName(locks, l.Env.Workspace, func(n string) bool { return names.held[n] })
	}
	if err != nil {
		return "", nil, err
	}
	if err := k.open(l, project); err != nil {
		release()
		return "", nil, err
	}
	return project, release, nil
}

// open makes, or for start takes, the sandbox's record, and holds it.
func (k *Keep) open(l *Launch, project string) error {
	k.dir = keepDir(k.dirs, nameOf(project))
	if err := os.MkdirAll(k.dir, 0o700); err != nil {
		return fmt.Errorf("making the record of sandbox %s: %w", nameOf(project), err)
	}
	lock, ok, err := takeLock(filepath.Join(k.dir, lockFile), lockWait)
	if err != nil {
		return fmt.Errorf("taking the record of sandbox %s: %w", nameOf(project), err)
	}
	if !ok {
		return fmt.Errorf("sandbox %s: %w", nameOf(project), ErrSupervised)
	}
	k.lock = lock
	os.Remove(filepath.Join(k.dir, stopFile))
	if k.Record != nil {
		k.rec = *k.Record
	} else {
		if old, err := readRecord(k.dir); err == nil && old.State != StateGone {
			k.close()
			return &ExistsError{Name: old.Name, State: old.State, Workspace: old.Workspace}
		}
		k.rec = Record{
			Name: nameOf(project), ID: k.ID, Project: project, Workspace: l.Env.Workspace, Target: l.Profile.Workspace.Target,
			Profile: l.Profile.Meta.File, Ref: l.Ref, Engine: l.Engine, Created: time.Now().UTC(), Log: k.Log,
			Default: k.Name == "",
		}
	}
	k.rec.State, k.rec.Why, k.rec.Supervisor = StateStarting, "", os.Getpid()
	return k.rec.write(k.dir)
}

// close lets go of the record (the supervisor ends).
func (k *Keep) close() {
	if k.lock != nil {
		k.lock.Close()
		k.lock = nil
	}
}

// ErrSupervised: a supervisor holds the sandbox already.
var ErrSupervised = errors.New("a supervisor holds it already")

// ExistsError: up was asked for a name a persistent sandbox has.
type ExistsError struct{ Name, State, Workspace string }

func (e *ExistsError) Error() string {
	return fmt.Sprintf("a persistent sandbox named %s exists already (%s, of %s)", e.Name, e.State, e.Workspace)
}

// labels are the sandbox's resources' labels that tie them to its record.
func (k *Keep) labels() types.Labels {
	return types.Labels{backend.LabelKeep: k.dir, backend.LabelKeepID: k.rec.ID}
}

// options are the generator's for a persistent sandbox: the keeper, and
// the profile's idle timeout.
func (k *Keep) options(o *generator.Options, l *Launch) error {
	exe, err := keeperBinary()
	if err != nil {
		return err
	}
	o.Keep = &generator.Keep{Binary: exe, Idle: l.Profile.Resources.Idle.Duration()}
	return nil
}

// keeperBinary is the executable a persistent sandbox's keeper runs: this
// one (or PROPIO_SANDBOX_GATEWAY_BINARY's, as for the gateway), which must
// be statically linked, for it runs in any image, without a dynamic linker
// or libraries.
func keeperBinary() (string, error) {
	exe, err := gatewayBinary()
	if err != nil {
		return "", err
	}
	files, err := gatewayimage.Files(exe)
	if err != nil {
		return "", gatewayError{err}
	}
	if len(files) > 1 {
		return "", &DynamicError{Exe: exe}
	}
	return exe, nil
}

// DynamicError: the launcher is dynamically linked, and a persistent
// sandbox's keeper, which is the launcher, runs in images that have
// neither its dynamic linker nor its libraries.
type DynamicError struct{ Exe string }

func (e *DynamicError) Error() string {
	return fmt.Sprintf("%s is dynamically linked: a persistent sandbox runs it as its main process, in an image that may have neither its dynamic linker nor its libraries", e.Exe)
}

// running records the sandbox as running, with where exec finds it, and
// says so.
func (k *Keep) running(ctx context.Context, r *run) error {
	id, err := r.rt.Container(ctx, r.project.Name, generator.Service)
	if err != nil {
		return err
	}
	if id == "" {
		return fmt.Errorf("sandbox %s has no %s container", k.rec.Name, generator.Service)
	}
	if k.project != nil {
		b, err := generator.Render(k.project)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(k.dir, projectFile), b, 0o600); err != nil {
			return fmt.Errorf("writing the project of sandbox %s: %w", k.rec.Name, err)
		}
	}
	facts, err := r.rt.Facts(ctx)
	if err != nil {
		return err
	}
	k.rec.Host, k.rec.APIVersion, k.rec.Container = facts.Host, facts.APIVersion, id
	if ext, err := generator.ReadExtension(r.project); err == nil && ext.Changeset != nil {
		k.rec.Changeset = ext.Changeset.ID
	}
	k.rec.State, k.rec.Why = StateRunning, ""
	if err := k.rec.write(k.dir); err != nil {
		return err
	}
	touch(filepath.Join(k.dir, busyFile))
	if !k.ready {
		k.ready = true
		if k.Ready != nil {
			k.Ready(nil)
		}
	}
	return nil
}

// touch makes path's mtime now, creating it.
func touch(path string) {
	now := time.Now()
	if os.Chtimes(path, now, now) != nil {
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600); err == nil {
			f.Close()
		}
	}
}

// ending is how a hold ended.
type ending int

const (
	endNone    ending = iota // it goes on
	endExited                // its main process ended: killed by the timeout or the disk cap, or from inside
	endDown                  // down, or idle: stopped, to be removed
	endStopped               // stop: stopped and kept
)

// hold holds the running sandbox until it ends: its main process ends
// (the launcher's timeout and disk cap kill it), down or stop signal the
// supervisor (SIGTERM; stop leaves stopFile first), it is idle, or the
// engine goes away and does not bring it back. Stopped (down, idle, stop),
// the sandbox is there to copy back and remove, or to keep.
func (k *Keep) hold(ctx context.Context, r *run, w *diskWatch, replan func(context.Context) error) (int, error) {
	if k.down {
		return 0, k.stop(ctx, r, endDown)
	}
	sigs := k.signals
	if sigs == nil {
		sigs = processSignals{}
	}
	sigc := make(chan os.Signal, 4)
	sigs.Notify(sigc)
	defer sigs.Stop(sigc)
	if err := k.running(ctx, r); err != nil {
		return 0, err
	}
	idle := newIdleWatch(filepath.Join(k.dir, busyFile), r.o.Keep.idleAfter(r))
	defer idle.stop()
	for {
		code, how, err := k.wait(ctx, r, sigc, idle)
		switch {
		case errors.Is(err, backend.ErrEngineGone):
			asked, err := k.engineBack(ctx, r, w, replan, sigc)
			switch {
			case err != nil:
				return 0, err
			case asked == endStopped:
				// The engine has stopped its containers: kept, as stop
				// keeps them; start runs them once the engine is back.
				k.kept = true
				return 0, nil
			case asked == endDown:
				return 0, &GoneError{Why: "removed (down) while the engine was away: what the engine kept of it goes with the next up, run or gc"}
			}
			continue // back
		case err != nil:
			return 0, err
		case how == endExited:
			k.why = fmt.Sprintf("its main process ended (exit %d)", code)
			return code, nil
		}
		return 0, k.stop(ctx, r, how)
	}
}

// stop stops the sandbox's containers, to remove them (down, idle), or to
// keep them (stop).
func (k *Keep) stop(ctx context.Context, r *run, how ending) error {
	if k.dir != "" {
		k.rec.State = StateStopping
		k.rec.write(k.dir)
	}
	k.kept = how == endStopped
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killBudget)
	defer cancel()
	return r.rt.Stop(ctx, r.project.Name)
}

// wait waits for the sandbox's container to stop, a signal, or the idle
// timeout, whichever comes first.
func (k *Keep) wait(ctx context.Context, r *run, sigc chan os.Signal, idle *idleWatch) (int, ending, error) {
	type result struct {
		code int
		err  error
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan result, 1)
	go func() {
		code, err := r.rt.Wait(wctx, r.project.Name, generator.Service)
		waited <- result{code, err}
	}()
	for {
		select {
		case res := <-waited:
			return res.code, endExited, res.err
		case <-sigc:
			return 0, k.asked(), nil
		case <-idle.expired:
			k.why = fmt.Sprintf("removed after resources.idle (%s) with no command run", idle.after)
			return 0, endDown, nil
		case <-ctx.Done():
			return 0, endDown, ctx.Err()
		}
	}
}

// idleAfter is the sandbox's idle timeout, as its project says.
func (k *Keep) idleAfter(r *run) time.Duration {
	ext, err := generator.ReadExtension(r.project)
	if err != nil || ext.Keep == nil {
		return 0
	}
	return ext.Keep.Idle
}

// engineBack waits, at most EngineWait, for an engine that went away to
// answer again, and starts the sandbox again in it: its containers, which
// the engine stopped, or kept running (Podman's, whose API service only
// went away). When the engine does not come back, or without them, the
// sandbox is gone. A stop or down meanwhile ends the wait: it says which
// (endStopped, endDown; endNone when the sandbox runs again), and the
// sandbox is not started again.
func (k *Keep) engineBack(ctx context.Context, r *run, w *diskWatch, replan func(context.Context) error, sigc chan os.Signal) (ending, error) {
	k.rec.State, k.rec.Why = StateRestarting, "the engine went away"
	k.rec.write(k.dir)
	w.stop()
	wait := cmp.Or(k.engineWait, engineWait())
	deadline := time.Now().Add(wait)
	var id string
	var err error
	for pause := 250 * time.Millisecond; ; pause = min(2*pause, 2*time.Second) {
		id, err = r.rt.Container(ctx, r.project.Name, generator.Service)
		if err == nil || !errors.Is(err, backend.ErrEngineGone) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return endNone, ctx.Err()
		case <-sigc:
			return k.asked(), nil
		case <-time.After(pause): // the engine says nothing when it is back
		}
	}
	switch {
	case err != nil && errors.Is(err, backend.ErrEngineGone):
		return endNone, &GoneError{Why: fmt.Sprintf("the engine went away and did not come back within %s", wait)}
	case err != nil:
		return endNone, &GoneError{Why: fmt.Sprintf("the engine came back, and could not say where the sandbox is: %v", err)}
	case id == "":
		return endNone, &GoneError{Why: "the engine came back without the sandbox's containers"}
	}
	if err := r.rt.Start(ctx, r.project); err != nil {
		return endNone, &GoneError{Why: fmt.Sprintf("the engine came back, and could not start the sandbox again: %v", err)}
	}
	if err := replan(ctx); err != nil {
		return endNone, err
	}
	return endNone, k.running(ctx, r)
}

// asked is what the supervisor's SIGTERM asks: stop, when stop left its
// file first, else down.
func (k *Keep) asked() ending {
	if _, err := os.Stat(filepath.Join(k.dir, stopFile)); err == nil {
		return endStopped
	}
	return endDown
}

// GoneError: a persistent sandbox is gone, and why.
type GoneError struct{ Why string }

func (e *GoneError) Error() string { return "the sandbox is gone: " + e.Why }

// finish records how the supervisor's hold ended: stopped and kept,
// removed (down, which then forgets the record), or gone, saying why. A
// sandbox that never ran leaves no record (up), or the one it had (start).
func (k *Keep) finish(code int, err error) {
	if k == nil || k.dir == "" {
		return
	}
	// The record's lock is let go with the process: free, the supervisor
	// is gone.
	if !k.ready {
		if k.Record == nil {
			os.RemoveAll(k.dir)
			return
		}
		// start failed: the sandbox is as it was.
		k.rec = *k.Record
		if k.rec.State != StateGone {
			k.rec.State, k.rec.Supervisor = StateStopped, 0
			k.rec.Why = fmt.Sprintf("start failed: %v", err)
		}
		k.rec.write(k.dir)
		return
	}
	k.rec.Supervisor = 0
	var gone *GoneError
	var over *backend.DiskCapError
	switch {
	case k.kept && err == nil:
		k.rec.State, k.rec.Why = StateStopped, ""
	case k.why == "" && err == nil:
		k.rec.State, k.rec.Why = StateGone, "removed (down)"
	case errors.As(err, &gone):
		k.rec.State, k.rec.Why = StateGone, gone.Why
	case errors.Is(err, ErrTimeout):
		k.rec.State, k.rec.Why = StateGone, err.Error()
	case errors.As(err, &over):
		k.rec.State, k.rec.Why = StateGone, over.Error()
	case err != nil:
		k.rec.State, k.rec.Why = StateGone, err.Error()
	default:
		k.rec.State, k.rec.Why = StateGone, k.why
	}
	k.rec.write(k.dir)
}

// start starts a persistent sandbox made already (start); to end one
// (Down), there is nothing to start. What a start that fails started is
// stopped again: the sandbox stays as it was.
func (k *Keep) start(ctx context.Context, r *run) error {
	if k.down {
		return nil
	}
	_, err := r.gatewayFirst(ctx)
	if err == nil {
		err = r.rt.Start(ctx, r.project)
	}
	if err != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killBudget)
		defer cancel()
		r.rt.Stop(sctx, r.project.Name)
	}
	return err
}

// sentinelsFile holds the sentinels of a persistent sandbox's secrets: its
// container's variables hold them, and its gateway, started again, must
// replace them still. Sentinels only, never a value.
const sentinelsFile = "sentinels.json"

// sentinels are the sentinels of the secrets named, for a run: new ones,
// kept in the record's directory for a persistent sandbox up makes; those
// kept for one started again.
func (k *Keep) sentinels(names []string) (map[string]string, error) {
	out := map[string]string{}
	if k.resuming() {
		path := filepath.Join(k.dir, sentinelsFile)
		b, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(b, &out)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the sentinels of sandbox %s: %w", k.Record.Name, err)
		}
		for _, name := range names {
			if out[name] == "" {
				return nil, fmt.Errorf("sandbox %s was made without secret %s: remove it (down) and make it again (up)", k.Record.Name, name)
			}
		}
		return out, nil
	}
	for _, name := range names {
		out[name] = broker.NewSentinel(name)
	}
	if k != nil {
		b, _ := json.Marshal(out)
		if err := fsutil.WriteFileAtomic(filepath.Join(k.dir, sentinelsFile), b, 0o600); err != nil {
			return nil, err
		}
	}
	return out, nil
}
