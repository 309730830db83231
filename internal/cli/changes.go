package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/spf13/cobra"
)

// changesetListing is one changeset in `changes --json`: fields are only ever added.
type changesetListing struct {
	ID        string            `json:"id"`
	Workspace string            `json:"workspace"`
	Profile   string            `json:"profile"`
	Created   time.Time         `json:"created"`
	Mode      changeset.Mode    `json:"mode"`
	State     changeset.State   `json:"state"`
	Mounts    []changeset.Mount `json:"mounts"`
	Files     *int              `json:"files"` // changed paths not applied yet; null while running
}

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
			st, err := changeset.DefaultStore()
			if err != nil {
				return err
			}
			list, err := st.List()
			if err != nil {
				return err
			}
			rows := []changesetListing{}
			for _, c := range list {
				row := changesetListing{ID: c.ID, Workspace: c.Workspace, Profile: c.Profile, Created: c.Created, Mode: c.Mode, State: c.State, Mounts: c.Mounts}
				if c.State != changeset.StateRunning {
					if cs, err := c.Changes(); err == nil {
						n := len(cs)
						row.Files = &n
					}
				}
				rows = append(rows, row)
			}
			if asJSON {
				enc := json.NewEncoder(a.stdout)
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
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Workspace, r.Profile, r.Created.Local().Format(time.DateTime), files, r.State)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// changesetAndPaths picks the changeset a review command works on and the
// paths it is limited to, from its positional arguments:
//
// The first argument is a changeset ID (or a unique prefix of one) when it
// is not an existing file or directory and some changeset's id starts with
// it; every other argument is a PATH. Without an ID, the newest changeset
// of the current directory's workspace (or of the workspace the current
// directory is in). `./NAME` always means a path.
func changesetAndPaths(args []string) (*changeset.Changeset, []string, error) {
	st, err := changeset.DefaultStore()
	if err != nil {
		return nil, nil, err
	}
	if len(args) > 0 && looksLikeID(args[0]) {
		if _, err := os.Lstat(args[0]); err != nil {
			c, err := st.Get(args[0])
			if err == nil {
				return c, args[1:], nil
			}
			if errors.Is(err, changeset.ErrAmbiguous) {
				return nil, nil, withHint(err, "give more of the id; `"+name+" changes` lists them")
			}
			if !errors.Is(err, changeset.ErrNotFound) {
				return nil, nil, err
			}
		}
	}
	ws, err := hostinfo.Workspace()
	if err != nil {
		return nil, nil, err
	}
	c, err := latestFor(st, ws)
	if err != nil {
		return nil, nil, err
	}
	return c, args, nil
}

// looksLikeID: ids are 20261122-064500-3f9a; a prefix has only digits,
// dashes and hex letters, and starts with a digit.
func looksLikeID(s string) bool {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return false
	}
	return strings.Trim(s, "0123456789abcdef-") == ""
}

// latestFor is the newest changeset of ws, or of the nearest workspace
// that holds ws.
func latestFor(st changeset.Store, ws string) (*changeset.Changeset, error) {
	list, err := st.List()
	if err != nil {
		return nil, err
	}
	var best *changeset.Changeset
	for _, c := range list { // oldest first: the newest of the longest wins
		if c.Workspace == ws || strings.HasPrefix(ws, strings.TrimSuffix(c.Workspace, string(filepath.Separator))+string(filepath.Separator)) {
			if best == nil || len(c.Workspace) >= len(best.Workspace) {
				best = c
			}
		}
	}
	if best == nil {
		hints := []string{"`" + name + " run --changeset` runs a sandbox whose writes go to a changeset"}
		if len(list) > 0 {
			hints = append(hints, "`"+name+" changes` lists the changesets of other directories; name one by its ID")
		}
		return nil, withHint(fmt.Errorf("no changeset for %s", ws), hints...)
	}
	return best, nil
}

// selectPaths resolves PATH arguments in c and keeps the changes they name.
// A PATH that names no change is an error: a mistyped path would otherwise
// look like "nothing to review".
func selectPaths(c *changeset.Changeset, cs []changeset.Change, paths []string) ([]changeset.Change, error) {
	if len(paths) == 0 {
		return cs, nil
	}
	cwd, _ := hostinfo.Workspace()
	var refs []changeset.Ref
	for _, p := range paths {
		ref, err := c.Resolve(p, cwd)
		if err != nil {
			return nil, withHint(err, "name paths relative to the current directory, as /TARGET/PATH of the sandbox, or as MOUNT:PATH ("+mountNames(c)+")")
		}
		if len(changeset.Select(cs, []changeset.Ref{ref})) == 0 {
			return nil, withHint(fmt.Errorf("%s: no change there in changeset %s", p, c.ID), "`"+name+" diff --stat "+c.ID+"` lists the changed paths")
		}
		refs = append(refs, ref)
	}
	return changeset.Select(cs, refs), nil
}

func mountNames(c *changeset.Changeset) string {
	var s []string
	for _, m := range c.Mounts {
		s = append(s, m.Name+" = "+m.Target)
	}
	return strings.Join(s, ", ")
}

// changesOf reads a changeset's changes, with a hint when it is not sealed.
func changesOf(c *changeset.Changeset) ([]changeset.Change, error) {
	cs, err := c.Changes()
	if err != nil && c.State == changeset.StateRunning {
		return nil, withHint(err, "review it when the run has ended; if its launcher was killed, `"+name+" run --changeset --resume "+c.ID+"` continues it and seals it at the end")
	}
	return cs, err
}
