package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/buildinputs"
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
	return buildImage(ctx, c.Runtime, b.project, generator.Service)
}

// buildImage builds the image of the project's service; when that fails
// and a base image of its Dockerfile is not on the engine (no registry to
// pull it from), the error is a *BaseImageError.
func buildImage(ctx context.Context, rt backend.Runtime, project *types.Project, service string) error {
	err := rt.Build(ctx, project, service)
	if err == nil || ctx.Err() != nil {
		return err
	}
	b := project.Services[service].Build
	df := b.Dockerfile
	if df == "" {
		df = "Dockerfile"
	}
	if !filepath.IsAbs(df) {
		df = filepath.Join(b.Context, df)
	}
	text, rerr := os.ReadFile(df)
	if rerr != nil {
		return err
	}
	var missing []string
	for _, image := range buildinputs.BaseImages(text) {
		if ok, herr := rt.HasImage(ctx, image); herr == nil && !ok {
			missing = append(missing, image)
		}
	}
	if len(missing) == 0 {
		return err
	}
	return &BaseImageError{Images: missing, Err: err}
}

// BaseImageError: a build failed, and base images its Dockerfile names are
// not on the engine, which could not pull them.
type BaseImageError struct {
	Images []string
	Err    error
}

func (e *BaseImageError) Error() string {
	return fmt.Sprintf("%v\nthe base image %s is not on the engine, and the engine could not pull it", e.Err, strings.Join(e.Images, ", "))
}

func (e *BaseImageError) Unwrap() error { return e.Err }

// Hints say how to get the base images.
func (e *BaseImageError) Hints() []string {
	hints := []string{"where a registry is reachable: docker pull " + strings.Join(e.Images, " ") + " (podman pull on Podman), then try again"}
	for _, image := range e.Images {
		if image == DebianBase {
			hints = append(hints, "without a registry: make "+DebianBase+" with debootstrap from Debian's mirror: sudo bash e2e/base-image.sh, in a propio-sandbox checkout")
		}
	}
	return append(hints, "or load it from a machine that has it: docker save IMAGE | docker load")
}

// DebianBase is the base image of the default image, which the
// repository's e2e/base-image.sh makes without a registry.
const DebianBase = "debian:bookworm-slim"
