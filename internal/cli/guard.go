package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/guard"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// checkGuard judges what a sandbox left, once it has gone, prints what
// was done, and forgets the plan. What could not be done is an error: a
// file git would run may still be there.
func (a *app) checkGuard(plan guard.Plan, dirs hostinfo.Dirs) error {
	return a.reportCheck(plan, plan.Check(dirs.QuarantineDir()), dirs)
}

func (a *app) reportCheck(plan guard.Plan, rep guard.Report, dirs hostinfo.Dirs) error {
	a.reportGuard(rep, dirs.QuarantineDir())
	if err := rep.Err(); err != nil {
		where := "the workspace"
		if len(plan.Roots) > 0 {
			where = plan.Roots[0].Source
		}
		return withHint(fmt.Errorf("checking what sandbox %s left: %w", plan.Project, err),
			"do not run git in "+where+" before you have looked at what the errors name")
	}
	return guard.Done(dirs.GuardDir(), plan.Project)
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

// finish waits for the check (starting it if need be), prints what it did,
// and forgets the plan.
func (a *app) finishGuard(g *guardCheck) error {
	g.begin()
	<-g.done
	return a.reportCheck(g.plan, g.rep, g.dirs)
}

// reportGuard prints what the guard did, one warning a path.
func (a *app) reportGuard(rep guard.Report, quarantine string) {
	if len(rep.Items) == 0 {
		return
	}
	fmt.Fprintf(a.stderr, "%s: warning: the sandbox left what git (or the host) would run; so that nothing runs it:\n", name)
	for _, it := range rep.Items {
		fmt.Fprintf(a.stderr, "%s: warning:   %s\n", name, it)
	}
	fmt.Fprintf(a.stderr, "%s: hint: what was put aside is kept in %s, never run; look at it before you put anything back\n", name, quarantine)
}

// checkPending judges what sandboxes of killed launchers left, once they
// are gone from the engine (gc has removed them).
func (a *app) checkPending(ctx context.Context, eng *engine.Engine, dirs hostinfo.Dirs) error {
	plans, err := guard.Pending(dirs.GuardDir())
	if err != nil || len(plans) == 0 {
		return err
	}
	list, err := eng.List(ctx)
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, s := range list {
		live[s.Project] = true
	}
	var errs []error
	for _, plan := range plans {
		if live[plan.Project] || engine.LauncherAlive(plan.PID, plan.Host) {
			continue
		}
		errs = append(errs, a.checkGuard(plan, dirs))
	}
	return errors.Join(errs...)
}
