package cli

import (
	"errors"
	"fmt"

	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/spf13/cobra"
)

func newValidate(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "validate [FILE...]",
		Short: "Check profile files against the schema and the rules, reporting every problem",
		Long: `Check profile files against the schema and the rules, reporting every problem as
FILE:LINE:COL: field.path: message. Without FILE, checks the profile that -p (or the
default) selects. Unknown keys are errors: a typo must never widen access.`,
		RunE: func(cmd *cobra.Command, files []string) error {
			e, err := loadEnv()
			if err != nil {
				return err
			}
			limits := hostinfo.Limits()
			var problems profile.List
			check := func(p *profile.Profile, err error) error {
				if err == nil {
					err = p.Check(limits)
				}
				var list profile.List
				if errors.As(err, &list) {
					problems = append(problems, list...)
					return nil
				}
				return err
			}
			if len(files) == 0 {
				if err := check(e.locs.Resolve(a.profile)); err != nil {
					return err
				}
			}
			for _, f := range files {
				if err := check(e.locs.ResolveFile(f)); err != nil {
					return err
				}
			}
			if len(problems) > 0 {
				for _, p := range problems {
					fmt.Fprintln(a.stderr, p.Error())
				}
				noun := "problems"
				if len(problems) == 1 {
					noun = "problem"
				}
				return withHint(fmt.Errorf("%d %s found", len(problems), noun), problems.Hints()...)
			}
			fmt.Fprintln(a.stdout, "ok")
			return nil
		},
	}
}
