package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

func newChanges(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "changes [--json]",
		Short: "List the changesets: id, workspace, profile, created, files changed, state",
		Long: `List the changesets kept for review (run --changeset makes them), oldest first:
id, workspace, profile, creation time, number of changed paths not applied yet, and
state: running (its sandbox is using it), ready (to review and apply) or partial
(some paths applied).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rows, err := sandbox.ListChangesets()
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(termsafe.JSON(a.stdout))
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			if len(rows) == 0 {
				fmt.Fprintln(a.stderr, "no changesets; `"+name+" run --changeset` makes one")
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tWORKSPACE\tPROFILE\tCREATED\tFILES\tSTATE")
			for _, r := range rows {
				files := "-"
				if r.Files != nil {
					files = strconv.Itoa(*r.Files)
				}
				tableRow(tw, r.ID, r.Workspace, r.Profile, r.Created.Local().Format(time.DateTime), files, string(r.State))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// findChangeset is sandbox.FindChangeset, with what to do when it finds
// none or several.
func findChangeset(args []string) (*sandbox.Changeset, []string, error) {
	c, paths, err := sandbox.FindChangeset(args)
	var none *sandbox.NoChangesetError
	switch {
	case errors.Is(err, sandbox.ErrChangesetAmbiguous):
		return nil, nil, withHint(err, "give more of the id; `"+name+" changes` lists them")
	case errors.As(err, &none):
		hints := []string{"`" + name + " run --changeset` runs a sandbox whose writes go to a changeset"}
		if none.Empty {
			hints = append(hints, "`"+name+" changes` lists them, with how many changes each holds")
		} else if none.Others {
			hints = append(hints, "`"+name+" changes` lists the changesets of other directories; name one by its ID")
		}
		return nil, nil, withHint(err, hints...)
	}
	return c, paths, err
}

// selectPaths keeps the changes of cs that paths name, with what to do
// about a PATH that names none.
func selectPaths(c *sandbox.Changeset, cs sandbox.Changes, paths []string) (sandbox.Changes, error) {
	cs, err := cs.Select(paths)
	var pe *sandbox.PathError
	var nc *sandbox.NoChangeError
	switch {
	case errors.As(err, &pe):
		return cs, withHint(err, "name paths relative to the current directory, as /TARGET/PATH of the sandbox, or as MOUNT:PATH ("+mountNames(c)+")")
	case errors.As(err, &nc):
		return cs, withHint(err, "`"+name+" diff --stat "+c.ID()+"` lists the changed paths")
	}
	return cs, err
}

func mountNames(c *sandbox.Changeset) string {
	var s []string
	for _, m := range c.Mounts() {
		s = append(s, m.Name+" = "+m.Target)
	}
	return strings.Join(s, ", ")
}

// changesOf reads a changeset's changes, with a hint when it is not sealed.
func changesOf(c *sandbox.Changeset) (sandbox.Changes, error) {
	cs, err := c.Changes()
	if err != nil && c.Running() {
		return cs, withHint(err, "review it when the run has ended; if its launcher was killed, `"+name+" run --changeset --resume "+c.ID()+"` continues it and seals it at the end")
	}
	return cs, err
}
