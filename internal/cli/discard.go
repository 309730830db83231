package cli

import (
	"errors"
	"fmt"

	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

func newDiscard(a *app) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "discard [ID] [--force]",
		Short: "Discard a changeset: remove it without touching the original files",
		Long: `Remove a changeset from the store; the original files are not touched. Without ID,
the newest changeset of the current directory's workspace. A changeset whose sandbox
is running is refused unless --force (for one whose launcher was killed).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, rest, err := findChangeset(args)
			if err != nil {
				return err
			}
			if len(rest) > 0 {
				return withHint(fmt.Errorf("no changeset %q", rest[0]), "`"+name+" changes` lists the changesets")
			}
			if err := c.Discard(force); err != nil {
				if errors.Is(err, sandbox.ErrChangesetRunning) {
					return withHint(err, "wait for the run to end; if its launcher is gone, `"+name+" discard --force "+c.ID()+"`")
				}
				return err
			}
			fmt.Fprintf(a.stdout, "discarded changeset %s\n", c.ID())
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "discard even while the changeset's sandbox is running")
	return cmd
}
