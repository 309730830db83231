package cli

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/propio/propio-sandbox/internal/guard"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

// envApplyPause is a test-only hook: apply sleeps this long (a Go
// duration) after each applied path, so that an end-to-end test can kill
// it halfway and check that running it again completes it. Never set it
// otherwise.
const envApplyPause = "PROPIO_SANDBOX_APPLY_PAUSE"

func newApply(a *app) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "apply [ID] [PATH...] [--force]",
		Short: "Apply a changeset, or some of its paths, to the original files",
		Long: `Apply a changeset to the original files: all of it, or the files and directories
PATH names (chosen as for diff). Each file is written to a temporary name in its
directory, synced and renamed into place; symlinks are made the same way; deletions
go deepest first.

A path whose original changed since the run started (and is not already what the
changeset makes) is a conflict: it is listed and left alone, and apply exits 1,
unless --force, which overwrites it. A path that already is what the changeset
makes counts as applied, so an interrupted apply can be run again to completion.
Once every path is applied the changeset is removed; until then it is partial and
diff shows only what is left. ID and PATH are taken as for diff.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, paths, err := changesetAndPaths(args)
			if err != nil {
				return err
			}
			cs, err := changesOf(c)
			if err != nil {
				return err
			}
			if cs, err = selectPaths(c, cs, paths); err != nil {
				return err
			}
			opts := changeset.ApplyOptions{Force: force}
			if v := os.Getenv(envApplyPause); v != "" {
				if opts.Pause, err = time.ParseDuration(v); err != nil {
					return fmt.Errorf("%s=%q: %w", envApplyPause, v, err)
				}
			}
			start := time.Now()
			res, err := c.Apply(cs, opts)
			// What the apply wrote is the sandbox's: git must not run it.
			if gerr := a.sweepApplied(c, start); gerr != nil {
				err = errors.Join(err, gerr)
			}
			if err != nil {
				return err
			}
			switch {
			case res.Removed:
				fmt.Fprintf(a.stdout, "applied %d path%s; changeset %s is fully applied and removed\n", len(res.Applied), plural(len(res.Applied)), c.ID)
			default:
				fmt.Fprintf(a.stdout, "applied %d path%s; %d left in changeset %s\n", len(res.Applied), plural(len(res.Applied)), res.Remaining, c.ID)
			}
			if len(res.Conflicts) == 0 {
				return nil
			}
			for _, cf := range res.Conflicts {
				fmt.Fprintf(a.stdout, "conflict: %s: %s\n", cf.Display, cf.Reason)
			}
			return withHint(fmt.Errorf("%d path%s not applied: the original changed since the run started", len(res.Conflicts), plural(len(res.Conflicts))),
				"`"+name+" diff "+c.ID+" PATH` shows what applying would replace",
				"`"+name+" apply --force "+c.ID+" PATH` overwrites it; `"+name+" discard "+c.ID+"` drops the changeset")
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "apply conflicting paths too, overwriting what changed in the original")
	return cmd
}

// sweepApplied judges what an apply wrote in each directory of the
// changeset, as run's guard judges what a sandbox left: nothing the host's
// git would run stays.
func (a *app) sweepApplied(c *changeset.Changeset, since time.Time) error {
	dirs, err := hostinfo.UserDirs()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range c.Mounts {
		rep := guard.Sweep(guard.Root{Name: m.Name, Source: m.Source}, since, dirs.QuarantineDir(), c.ID)
		sandbox.Guarded(reporter{a.stderr}, rep, dirs.QuarantineDir())
		errs = append(errs, rep.Err())
	}
	return errors.Join(errs...)
}
