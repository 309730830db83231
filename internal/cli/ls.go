package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

func newLs(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the sandboxes on the engine: project, workspace, profile, launcher, state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var list []sandbox.Sandbox
			err := a.withEngine(func(ctx context.Context, c *sandbox.Conn) (err error) {
				list, err = sandbox.List(ctx, c)
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []sandbox.Sandbox{}
				}
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PROJECT\tWORKSPACE\tPROFILE\tLAUNCHER\tSTATE\tCREATED")
			for _, s := range list {
				launcher := strconv.Itoa(s.PID)
				if !s.Alive {
					launcher += " (gone)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Project, s.Workspace, s.Profile, launcher, s.State, s.Created.Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newGC(a *app) *cobra.Command {
	var prepared bool
	cmd := &cobra.Command{
		Use:   "gc [--prepared]",
		Short: "Remove what sandboxes of killed launchers left behind (containers, networks, volumes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dirs, err := hostinfo.UserDirs()
			if err != nil {
				return err
			}
			var removed, ahead []string
			err = a.withEngine(func(ctx context.Context, c *sandbox.Conn) (err error) {
				if prepared {
					ahead, err = sandbox.DiscardPrepared(ctx, dirs)
					for _, p := range ahead {
						fmt.Fprintf(a.stdout, "removed %s (prepared ahead)\n", p)
					}
					if err != nil {
						return err
					}
				}
				removed, err = sandbox.GC(ctx, reporter{a.stderr}, c, dirs)
				return err
			})
			for _, p := range removed {
				fmt.Fprintf(a.stdout, "removed %s\n", p)
			}
			if err == nil && len(removed)+len(ahead) == 0 {
				fmt.Fprintln(a.stdout, "nothing to remove")
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&prepared, "prepared", false, "also remove the gateways prepared ahead for the next runs (of all your workspaces)")
	return cmd
}
