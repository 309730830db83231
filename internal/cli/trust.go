package cli

import (
	"fmt"
	"strings"

	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/spf13/cobra"
)

func newTrust(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "trust [-p PATH]",
		Short: "Show what a repository profile grants, and trust it as it is now",
		Long: `A profile checked in at .propio/sandbox.yaml lives in a workspace the agent can
write, so it must not widen its own sandbox: run refuses a repository profile that is
new or changed since it was last trusted. trust prints what the profile grants, after
extends, and records the hash of every file of its chain under
$XDG_STATE_HOME/propio-sandbox/.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, p, err := loadSelected(a.profile)
			if err != nil {
				return err
			}
			a.warnGrants(e.grants)
			if !profile.NeedsTrust(p, e.workspace) {
				fmt.Fprintf(a.stdout, "%s is not a repository profile: it needs no trust\n", p.Meta.File)
				return nil
			}
			out, err := p.YAML()
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s grants, after extends (%s):\n\n", p.Meta.File, chainComment(p))
			for _, line := range strings.SplitAfter(string(out), "\n") {
				if line != "" {
					fmt.Fprint(a.stdout, "    "+line)
				}
			}
			store := profile.TrustStore{Dir: e.dirs.State}
			if err := store.Trust(p); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "\ntrusted %s as it is now; any change to it needs trust again\n", p.Meta.File)
			return nil
		},
	}
}

// chainComment describes an extends chain: leaf, then what it extends.
func chainComment(p *profile.Profile) string {
	files := make([]string, len(p.Meta.Chain))
	for i, s := range p.Meta.Chain {
		files[i] = s.File
	}
	return strings.Join(files, " extends ")
}
