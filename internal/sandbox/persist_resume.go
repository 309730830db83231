package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	cslaunch "github.com/propio/propio-sandbox/internal/changeset/launch"
	"github.com/propio/propio-sandbox/internal/guard"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// Supervise is a persistent sandbox's supervisor: it runs l (whose Keep
// is set) until the sandbox is stopped, removed or gone, and records how it
// ended. It returns what l.Run returns.
func Supervise(ctx context.Context, l *Launch) (int, error) {
	code, err := l.Run(ctx)
	l.Keep.finish(code, err)
	return code, err
}

// resume starts a stopped persistent sandbox again (start): the containers
// up made, with what they wrote, and around them what a supervisor serves
// while the sandbox runs (the agent's requests, the gateway's files, the
// guard's watch, the changeset's end). Nothing is checked or made again:
// the sandbox is what up checked and made (the profile is read again only
// for what the supervisor serves, and the guard's scan).
func (l *Launch) resume(ctx context.Context) (int, error) {
	k := l.Keep
	conn, err := Connect(ctx, cmp.Or(l.Engine, k.Record.Engine, l.Profile.Engine), l.Streams)
	if err != nil {
		if l.Hint != nil {
			err = l.Hint(err)
		}
		return 0, err
	}
	defer conn.Close()
	s := &launch{Launch: l, report: l.Report, rt: conn.Runtime, gcDone: make(chan struct{})}
	close(s.gcDone) // the leftovers are gc's and the next launch's
	if s.facts, err = s.rt.Facts(ctx); err != nil {
		return 0, err
	}
	name, release, err := k.claim(l.Env.Dirs, l, engineNames{})
	if err != nil {
		return 0, err
	}
	defer release()
	project, err := k.loadProject(ctx)
	if err != nil {
		return 0, err
	}
	s.opts = generator.Options{Project: name}
	if s.plan, err = NewPlan(s.Env, s.Profile); err != nil {
		return 0, err
	}
	return s.guarded(func(check *guardCheck) (int, error) {
		var cs *cslaunch.Changeset
		if id := k.Record.Changeset; id != "" {
			if cs, err = cslaunch.Reattach(id); err != nil {
				return 0, err
			}
		}
		ext, err := generator.ReadExtension(project)
		if err != nil {
			return 0, err
		}
		if ext.Gateway != nil {
			if err := s.gatewayFiles(name, ext.Gateway.Subnet, false); err != nil {
				return 0, err
			}
			// Its gateway starts with a CA of its own and without the
			// secrets' values: they are handed to it again.
			if _, err := s.prepareBroker(ctx, project, true); err != nil {
				return 0, err
			}
		}
		ran := false
		code, err := s.runProject(ctx, project, os.LookupEnv, check, &ran)
		if ran && cs != nil && !k.Kept() {
			if serr := cs.Finish(s.Streams.Err, errors.Is(err, ErrCopyOut)); serr != nil {
				err = errors.Join(err, serr)
			}
		}
		return code, err
	})
}

// loadProject loads the project up made the sandbox of.
func (k *Keep) loadProject(ctx context.Context) (*types.Project, error) {
	path := filepath.Join(k.dir, projectFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the project of sandbox %s: %w", k.Record.Name, err)
	}
	p, err := loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  k.Record.Workspace,
		ConfigFiles: []types.ConfigFile{{Filename: path, Content: b}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName(k.Record.Project, true) })
	if err != nil {
		return nil, fmt.Errorf("loading the project of sandbox %s: %w", k.Record.Name, err)
	}
	return p, nil
}

// Down removes a persistent sandbox that no supervisor holds (stopped, or
// its supervisor killed) as its supervisor would: stopped, what it wrote
// in a copy changeset copied back, its changeset sealed for review,
// everything of it removed, what it left in the workspace judged by the
// guard. One that is gone has only its leftovers removed. Its record is
// forgotten.
func Down(ctx context.Context, e Env, rec Record, c *Conn, r Reporter, w io.Writer) error {
	k := &Keep{Record: &rec, down: true, dirs: e.Dirs, dir: keepDir(e.Dirs, rec.Name)}
	lock, ok, err := takeLock(filepath.Join(k.dir, lockFile), lockWait)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("sandbox %s: %w", rec.Name, ErrSupervised)
	}
	defer lock.Close()
	locks, err := namesDir()
	if err != nil {
		return err
	}
	_, release, err := holdName(locks, rec.Project)
	if err != nil {
		return err
	}
	defer release()
	project, perr := k.loadProject(ctx)
	if rec.State == StateGone || perr != nil {
		err = c.Runtime.Remove(ctx, rec.Project, 0)
	} else {
		err = downProject(ctx, c, k, project, w)
	}
	err = errors.Join(err, CheckPending(ctx, r, c.Runtime, e.Dirs))
	if err == nil {
		Forget(e.Dirs, rec)
	}
	return err
}

// downProject stops, copies back and removes the sandbox of project, and
// seals its changeset.
func downProject(ctx context.Context, c *Conn, k *Keep, project *types.Project, w io.Writer) error {
	var cs *cslaunch.Changeset
	if id := k.Record.Changeset; id != "" {
		var err error
		if cs, err = cslaunch.Reattach(id); err != nil {
			return err
		}
	}
	_, err := Run(ctx, c.Runtime, project, RunOptions{Keep: k, ImageChecked: true})
	if cs != nil {
		if serr := cs.Finish(w, errors.Is(err, ErrCopyOut)); serr != nil {
			err = errors.Join(err, serr)
		}
	}
	return err
}

// Forget removes the record of a persistent sandbox that is no more, and
// its supervisors' log.
func Forget(dirs hostinfo.Dirs, rec Record) {
	os.RemoveAll(keepDir(dirs, rec.Name))
	if rec.Log != "" {
		os.Remove(rec.Log)
	}
}

// Control asks the supervisor of rec to stop the sandbox and keep it
// (stop), or to remove it (down), and waits until it has, copying to w what
// the supervisor says meanwhile (what the guard put aside, the changeset
// to review). It returns the record as the supervisor left it.
func Control(ctx context.Context, dirs hostinfo.Dirs, rec Record, stop bool, w io.Writer) (Record, error) {
	dir := keepDir(dirs, rec.Name)
	if stop {
		if err := os.WriteFile(filepath.Join(dir, stopFile), nil, 0o600); err != nil {
			return rec, err
		}
	}
	var offset int64
	if st, err := os.Stat(rec.Log); err == nil {
		offset = st.Size()
	}
	if err := syscall.Kill(rec.Supervisor, syscall.SIGTERM); err != nil {
		return rec, fmt.Errorf("signalling the supervisor of sandbox %s (pid %d): %w", rec.Name, rec.Supervisor, err)
	}
	if err := waitUnlocked(ctx, filepath.Join(dir, lockFile)); err != nil {
		return rec, err
	}
	if f, err := os.Open(rec.Log); err == nil {
		f.Seek(offset, io.SeekStart)
		io.Copy(w, f)
		f.Close()
	}
	return readRecord(dir)
}

// waitUnlocked waits until no process holds the lock at path (the
// supervisor has ended), or ctx ends.
func waitUnlocked(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		done <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		f.Close()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// StopUnsupervised stops a persistent sandbox whose supervisor was killed
// (nothing watches it: no idle timeout, no disk watch), keeping it as stop
// does, and judges what it left in the workspace (its supervisor could
// not). start resumes it.
func StopUnsupervised(ctx context.Context, c *Conn, r Reporter, dirs hostinfo.Dirs, rec Record) error {
	dir := keepDir(dirs, rec.Name)
	lock, ok, err := takeLock(filepath.Join(dir, lockFile), lockWait)
	if err != nil || !ok {
		return err // a supervisor holds it again
	}
	defer lock.Close()
	if err := c.Runtime.Stop(ctx, rec.Project); err != nil {
		return err
	}
	plans, err := guard.Pending(dirs.GuardDir())
	if err != nil {
		return err
	}
	for _, plan := range plans {
		if plan.Project == rec.Project && plan.PID == rec.Supervisor {
			if err := reportCheck(r, plan, plan.Check(dirs.QuarantineDir()), dirs); err != nil {
				r.Failed(err)
			}
		}
	}
	rec.State = StateStopped
	rec.Why = fmt.Sprintf("stopped: its supervisor (pid %d) was gone", rec.Supervisor)
	rec.Supervisor = 0
	return rec.write(dir)
}
