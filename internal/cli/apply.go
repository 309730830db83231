package cli

import (
	"fmt"
	"os"
	"time"

	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/propio/propio-sandbox/internal/termsafe"
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
			c, paths, err := findChangeset(args)
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
			opts := sandbox.ApplyOptions{Force: force}
			if v := os.Getenv(envApplyPause); v != "" {
				if opts.Pause, err = time.ParseDuration(v); err != nil {
					return fmt.Errorf("%s=%q: %w", envApplyPause, v, err)
				}
			}
			res, err := cs.Apply(opts)
			for _, rep := range res.Swept {
				sandbox.Guarded(reporter{a.stderr}, rep, res.Quarantine)
			}
			if err != nil {
				return err
			}
			return a.applied(c, res)
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "apply conflicting paths too, overwriting what changed in the original")
	return cmd
}

// applied says what apply did; conflicts make it an error.
func (a *app) applied(c *sandbox.Changeset, res sandbox.Applied) error {
	switch {
	case res.Removed:
		fmt.Fprintf(a.stdout, "applied %d path%s; changeset %s is fully applied and removed\n", res.Applied, plural(res.Applied), c.ID())
	default:
		fmt.Fprintf(a.stdout, "applied %d path%s; %d left in changeset %s\n", res.Applied, plural(res.Applied), res.Remaining, c.ID())
	}
	if len(res.Conflicts) == 0 {
		return nil
	}
	for _, cf := range res.Conflicts {
		fmt.Fprintf(a.stdout, "conflict: %s: %s\n", termsafe.Inert(cf.Display), termsafe.Inert(cf.Reason))
	}
	id := c.ID()
	return withHint(fmt.Errorf("%d path%s not applied: the original changed since the run started", len(res.Conflicts), plural(len(res.Conflicts))),
		"`"+name+" diff "+id+" PATH` shows what applying would replace",
		"`"+name+" apply --force "+id+" PATH` overwrites it; `"+name+" discard "+id+"` drops the changeset")
}
