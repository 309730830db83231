package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/guard"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// GuardError: what a sandbox left could not all be judged or put aside; a
// file git would run may still be in Where.
type GuardError struct {
	Project string
	Where   string // the first directory the guard watched
	Err     error
}

func (e *GuardError) Error() string {
	return fmt.Sprintf("checking what sandbox %s left: %v", e.Project, e.Err)
}
func (e *GuardError) Unwrap() error { return e.Err }

// reportCheck says what the guard did and forgets the plan; what could not
// be done is a *GuardError.
func reportCheck(r Reporter, plan guard.Plan, rep guard.Report, dirs hostinfo.Dirs) error {
	if err := reported(r, plan, rep, dirs); err != nil {
		return err
	}
	return guard.Done(dirs.GuardDir(), plan.Project)
}

// reported says what the guard did; what it could not do is a
// *GuardError.
func reported(r Reporter, plan guard.Plan, rep guard.Report, dirs hostinfo.Dirs) error {
	Guarded(r, rep, dirs.QuarantineDir())
	if err := rep.Err(); err != nil {
		where := "the workspace"
		if len(plan.Roots) > 0 {
			where = plan.Roots[0].Source
		}
		return &GuardError{Project: plan.Project, Where: where, Err: err}
	}
	return nil
}

// guardCheck is the end-of-run check of one launch, started as soon as the
// sandbox's command has ended (its container has exited: nothing writes any
// more), so that it runs while the engine removes the containers, or else
// when the launch ends.
type guardCheck struct {
	plan  guard.Plan
	dirs  hostinfo.Dirs
	start sync.Once
	done  chan struct{}
	rep   guard.Report
}

func newGuardCheck(plan guard.Plan, dirs hostinfo.Dirs) *guardCheck {
	return &guardCheck{plan: plan, dirs: dirs, done: make(chan struct{})}
}

// begin starts the check, once.
func (g *guardCheck) begin() {
	g.start.Do(func() {
		go func() {
			defer close(g.done)
			g.rep = g.plan.Check(g.dirs.QuarantineDir())
		}()
	})
}

// finish waits for the check (starting it if need be), says what it did,
// and forgets the plan.
func (g *guardCheck) finish(r Reporter) error {
	g.begin()
	<-g.done
	return reportCheck(r, g.plan, g.rep, g.dirs)
}

// CheckPending judges what sandboxes of killed launchers left, once they
// are gone from the engine (gc has removed them).
func CheckPending(ctx context.Context, r Reporter, rt backend.Runtime, dirs hostinfo.Dirs) error {
	plans, err := guard.Pending(dirs.GuardDir())
	if err != nil || len(plans) == 0 {
		return err
	}
	list, err := rt.List(ctx)
	if err != nil {
		return err
	}
	// A sandbox is its launcher's: once a launcher is gone, another may
	// run under the same name.
	type launcher struct {
		project, host string
		pid           int
	}
	live := map[launcher]bool{}
	for _, s := range list {
		live[launcher{s.Project, s.Host, s.PID}] = true
	}
	var errs []error
	for _, plan := range plans {
		if live[launcher{plan.Project, plan.Host, plan.PID}] || backend.LauncherAlive(plan.PID, plan.Host) {
			continue
		}
		errs = append(errs, reportCheck(r, plan, plan.Check(dirs.QuarantineDir()), dirs))
	}
	return errors.Join(errs...)
}

// Collected is what gc did: the projects it removed, and the persistent
// sandboxes it stopped (their supervisors were killed).
type Collected struct {
	Removed, Stopped []string
}

// GC removes what sandboxes of killed launchers left on the engine (and
// the resources of persistent sandboxes whose records are gone), stops the
// persistent sandboxes whose supervisors were killed (kept: start resumes
// them), and judges what they all left in their workspaces. A persistent
// sandbox that is stopped is no leftover: down removes it.
func GC(ctx context.Context, r Reporter, c *Conn, dirs hostinfo.Dirs) (Collected, error) {
	var out Collected
	list, err := c.Runtime.List(ctx)
	if err != nil {
		return out, err
	}
	out.Removed, err = removeLeftovers(ctx, c.Runtime, list)
	recs, rerr := Records(dirs)
	for _, rec := range recs {
		if !rec.Unsupervised() {
			continue
		}
		if serr := StopUnsupervised(ctx, c, r, dirs, rec); serr != nil {
			rerr = errors.Join(rerr, serr)
			continue
		}
		out.Stopped = append(out.Stopped, rec.Name)
	}
	return out, errors.Join(err, rerr, CheckPending(ctx, r, c.Runtime, dirs))
}

// launchStates says, of the sandboxes the engine listed, what a launch's
// background processes do with them: a gateway prepared ahead is in state
// prepared until a run adopts it (the run is listed then, not the
// gateway); what a background process removes for a launcher that is gone
// is in state removing.
func launchStates(list []Sandbox) ([]Sandbox, error) {
	dir, err := namesDir()
	if err != nil {
		return nil, err
	}
	run := map[string]bool{} // projects a run made some of
	for _, s := range list {
		if !s.Prepared {
			run[s.Project] = true
		}
	}
	out := list[:0]
	for _, s := range list {
		switch {
		case s.Prepared && s.Alive && run[s.Project]:
			continue // adopted: the run shows
		case s.Prepared && s.Alive && s.State == "running":
			s.State = "prepared"
		case !s.Alive && backend.SameHost(s.Host) && nameBusy(dir, s.Project, s.PID):
			s.State = "removing"
		}
		out = append(out, s)
	}
	return out, nil
}

// Guarded says what the guard did, if it did anything, and which files
// the user's hooks run the sandbox changed.
func Guarded(r Reporter, rep guard.Report, quarantine string) {
	for _, it := range rep.Named {
		r.Warn(it.String())
	}
	if len(rep.Items) == 0 {
		return
	}
	var items []string
	for _, it := range rep.Items {
		items = append(items, it.String())
	}
	r.Guarded(items, quarantine)
}
