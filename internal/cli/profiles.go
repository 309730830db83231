package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newProfiles(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profiles",
		Short: "List the profiles there are: name, source, description",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, err := loadEnv()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSOURCE\tDESCRIPTION")
			for _, p := range e.locs.List() {
				source := p.Source
				if p.Shadowed {
					source += " (overridden)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, source, p.Description)
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "show [NAME|PATH]",
		Short: "Print a profile as it resolves: extends merged, defaults applied",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref := a.profile
			if len(args) == 1 {
				ref = args[0]
			}
			_, p, err := loadSelected(ref)
			if err != nil {
				return err
			}
			out, err := p.YAML()
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "# %s\n", chainComment(p))
			_, err = a.stdout.Write(out)
			return err
		},
	})
	return cmd
}
