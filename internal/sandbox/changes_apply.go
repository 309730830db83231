package sandbox

import (
	"errors"
	"time"

	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/propio/propio-sandbox/internal/guard"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// ApplyOptions change how Apply works.
type ApplyOptions struct {
	// Force applies conflicting paths too, overwriting what changed in the
	// original since the run started.
	Force bool
	// Pause sleeps this long after each applied path. Test-only: the CLI
	// sets it from PROPIO_SANDBOX_APPLY_PAUSE so that an end-to-end test
	// can kill apply halfway; never set it otherwise.
	Pause time.Duration
}

// Conflict is a path apply left alone, and why.
type Conflict struct {
	Display string // the path as diff shows it
	Reason  string
}

// Applied says what Apply did.
type Applied struct {
	Applied   int        // paths written, deleted or chmod'ed now, or found already applied
	Conflicts []Conflict // paths left alone
	Removed   bool       // every path of the changeset is applied: it was removed from the store
	Remaining int        // paths of the changeset still to apply
	// Swept are what the guard did to what the apply wrote, one report a
	// directory of the changeset; what it put aside is in Quarantine.
	Swept      []guard.Report
	Quarantine string
}

// Apply makes the originals of the changes what the changeset holds (see
// changeset's Apply), then judges what it wrote in each directory of the
// changeset as a run's guard judges what a sandbox left: nothing the
// host's git would run stays. The guard's reports are in Applied even when
// the error is not nil.
func (cs Changes) Apply(opts ApplyOptions) (Applied, error) {
	start := time.Now()
	res, err := cs.c.Apply(cs.list, changeset.ApplyOptions{Force: opts.Force, Pause: opts.Pause})
	out := Applied{Applied: len(res.Applied), Removed: res.Removed, Remaining: res.Remaining}
	for _, cf := range res.Conflicts {
		out.Conflicts = append(out.Conflicts, Conflict{Display: cf.Display, Reason: cf.Reason})
	}
	// What the apply wrote is the sandbox's: git must not run it.
	if gerr := out.sweep(cs.c, start); gerr != nil {
		err = errors.Join(err, gerr)
	}
	return out, err
}

// sweep runs the guard's sweep on each directory of c, for what was
// written there since.
func (a *Applied) sweep(c *changeset.Changeset, since time.Time) error {
	dirs, err := hostinfo.UserDirs()
	if err != nil {
		return err
	}
	a.Quarantine = dirs.QuarantineDir()
	var errs []error
	for _, m := range c.Mounts {
		rep := guard.Sweep(guard.Root{Name: m.Name, Source: m.Source}, since, a.Quarantine, c.ID)
		a.Swept = append(a.Swept, rep)
		errs = append(errs, rep.Err())
	}
	return errors.Join(errs...)
}

// Discard removes the changeset from the store, without touching the
// original files. One whose sandbox is running is ErrChangesetRunning,
// unless force (for one whose launcher was killed).
func (c *Changeset) Discard(force bool) error { return c.c.Discard(force) }
