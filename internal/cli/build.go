package cli

import (
	"context"
	"fmt"

	"github.com/propio/propio-sandbox/generator"
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
			project, err := e.project(p, nil, generator.ProjectName(e.workspace, "build"))
			if err != nil {
				return err
			}
			ctx := context.Background()
			eng, err := connect(ctx, a)
			if err != nil {
				return err
			}
			defer eng.Close()
			fmt.Fprintf(a.stderr, "%s: building %s from %s\n", name, p.Image, project.Services[generator.Service].Build.Context)
			if err := eng.Build(ctx, project); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "built %s\n", p.Image)
			return nil
		},
	}
}
