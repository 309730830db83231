package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

func newDiff(a *app) *cobra.Command {
	var stat, asJSON bool
	cmd := &cobra.Command{
		Use:   "diff [ID] [PATH...] [--stat] [--json]",
		Short: "Show a changeset as a unified diff against the original files",
		Long: `Show what a changeset would change: a git-style unified diff (three lines of
context) of added, modified and deleted files, mode changes, symlinks (their target
shown as content) and directories; binary files are summarised with their sizes.
--stat prints one line per file and a summary; --json the changes as one object.
On a terminal, the content's control characters (an escape, a carriage return) are
shown escaped; to a file or a pipe, the diff is byte for byte (for git apply).

ID is a changeset id or a unique prefix of one; without it, the newest changeset of
the current directory's workspace. The first argument is taken as an ID when it is
not an existing file or directory and a changeset's id starts with it; write ./NAME
for a path that could be mistaken for one. PATH limits the diff to those files or
directories: relative to the current directory, /TARGET/PATH as the sandbox saw it
(/workspace/src, /repo2/x), or MOUNT:PATH (workspace:src, mount-1:x).
Paths the original changed since the run started are conflicts: apply refuses them
without --force; they are listed on standard error.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if stat && asJSON {
				return usageError{fmt.Errorf("--stat and --json exclude each other")}
			}
			return a.diff(args, stat, asJSON)
		},
	}
	cmd.Flags().BoolVar(&stat, "stat", false, "print a diffstat: one line per file and a summary")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the changes as JSON")
	return cmd
}

// diff prints the changes of the changeset args name (or of this
// workspace) that the rest of args select, as a unified diff, a diffstat
// or JSON.
func (a *app) diff(args []string, stat, asJSON bool) error {
	c, paths, err := findChangeset(args)
	if err != nil {
		return err
	}
	cs, err := changesOf(c)
	if err != nil {
		return err
	}
	if cs.Len() == 0 && !asJSON {
		fmt.Fprintf(a.stderr, "changeset %s holds no changes\n", c.ID())
		return nil
	}
	if cs, err = selectPaths(c, cs, paths); err != nil {
		return err
	}
	d, err := cs.Diff()
	if err != nil {
		return err
	}
	switch {
	case asJSON:
		enc := json.NewEncoder(termsafe.JSON(a.stdout))
		enc.SetIndent("", "  ")
		return enc.Encode(d.Report())
	case stat:
		err = d.WriteStat(a.stdout, 80)
	case isTerminal(a.stdout):
		// The content is the sandbox's: on a terminal, shown inert (to a
		// file or a pipe, as it is, for git apply).
		var b strings.Builder
		if err = d.WriteUnified(&b); err == nil {
			_, err = io.WriteString(a.stdout, termsafe.Text(b.String()))
		}
	default:
		err = d.WriteUnified(a.stdout)
	}
	if err != nil {
		return err
	}
	warnConflicts(a, d.Conflicts())
	return nil
}

// warnConflicts lists on stderr the paths apply would refuse.
func warnConflicts(a *app, conflicts []string) {
	n := len(conflicts)
	if n == 0 {
		return
	}
	fmt.Fprintf(a.stderr, "%s: warning: %d path%s changed in the original since the run started (apply refuses them without --force):\n", name, n, plural(n))
	for _, p := range conflicts {
		fmt.Fprintf(a.stderr, "  %s\n", termsafe.Inert(p))
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
