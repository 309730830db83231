package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

func newBuild(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "build [-p PROFILE]",
		Short: "Build the image of a profile that has a build section, showing progress",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, p, err := loadSelected(a.profile)
			if err != nil {
				return err
			}
			if p.Build == nil {
				return withHint(fmt.Errorf("%s has no build section: it uses the image %s as it is", p.Meta.File, p.Image),
					"build or pull "+p.Image+" yourself, or add build: {context: ...} to the profile")
			}
			// What the build reads of the workspace must be trusted as it is
			// (and a repository profile too), as for run --build.
			if r := a.trustCheck(e, p); !r.OK {
				return withHint(errors.New(r.Reason), r.Hints...)
			}
			b, err := sandbox.NewBuild(e.sandbox(), p, reporter{a.stderr})
			if err != nil {
				return hintError(err, p, a.profile)
			}
			err = a.withEngineOf(p.Engine, func(ctx context.Context, c *sandbox.Conn) error {
				fmt.Fprintf(a.stderr, "%s: building %s from %s\n", name, p.Image, b.Context())
				return b.Run(ctx, c)
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "built %s\n", p.Image)
			return nil
		},
	}
}
