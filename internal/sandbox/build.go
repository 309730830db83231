package sandbox

import (
	"context"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
)

// Build is the build of a profile's image (a profile with a build section).
type Build struct {
	project *types.Project
}

// NewBuild generates the project whose image is built, saying the plan's
// warnings.
func NewBuild(e Env, p *profile.Profile, r Reporter) (*Build, error) {
	plan, err := NewPlan(e, p)
	if err != nil {
		return nil, err
	}
	for _, w := range plan.Warnings {
		r.Warn(w)
	}
	project, err := plan.Generate(generator.Options{Project: generator.ProjectName(e.Workspace, "build")})
	if err != nil {
		return nil, err
	}
	return &Build{project: project}, nil
}

// Context is the build context, on the host.
func (b *Build) Context() string { return b.project.Services[generator.Service].Build.Context }

// Run builds the image on the engine, showing progress on the streams it
// was connected with.
func (b *Build) Run(ctx context.Context, c *Conn) error {
	return c.Runtime.Build(ctx, b.project, generator.Service)
}
