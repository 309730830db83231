package cli

import (
	"errors"
	"fmt"

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
			var problems profile.List
			var failed []error // files that could not be checked at all
			check := func(_ *profile.Profile, err error) {
				var list profile.List
				if errors.As(err, &list) {
					problems = append(problems, list...)
				} else if err != nil {
					failed = append(failed, hintLoad(err))
				}
			}
			if len(files) == 0 {
				check(e.locs.Load(a.profile))
			}
			for _, f := range files {
				check(e.locs.LoadFile(f))
			}
			for _, p := range problems {
				fmt.Fprintln(a.stderr, p.Error())
			}
			if len(problems) > 0 {
				noun := "problems"
				if len(problems) == 1 {
					noun = "problem"
				}
				failed = append(failed, withHint(fmt.Errorf("%d %s found", len(problems), noun), problems.Hints()...))
			}
			if len(failed) > 0 {
				return errors.Join(failed...)
			}
			fmt.Fprintln(a.stdout, "ok")
			return nil
		},
	}
}
