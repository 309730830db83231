package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/docker/cli/cli/command/image/build"
	"github.com/moby/go-archive"
	buildtypes "github.com/moby/moby/api/types/build"
	"github.com/moby/moby/api/types/jsonstream"
	"github.com/moby/moby/api/types/registry"
	"github.com/moby/moby/client"
	"github.com/moby/moby/client/pkg/jsonmessage"
)

// Build builds the image of the project's service from its build section,
// as `docker build` does with the classic builder, through the engine's API
// (Docker's and Podman's): the context directory sent as a tar stream,
// less what its .dockerignore excludes, and the build's progress (each
// step, and what its commands print) shown on the launcher's error stream
// as the engine sends it. Not through the Compose SDK's build: with
// BuildKit it wants the buildx plugin of a docker CLI, and without one it
// warns that it falls back to this.
func (e *Engine) Build(ctx context.Context, project *types.Project, service string) error {
	svc, ok := project.Services[service]
	if !ok || svc.Build == nil {
		return errors.New("the profile has no build section: nothing to build")
	}
	body, dockerfile, err := buildContext(svc.Build.Context, svc.Build.Dockerfile)
	if err != nil {
		return fmt.Errorf("building %s: %w", svc.Image, err)
	}
	defer body.Close()
	args := e.cli.ConfigFile().ParseProxyConfig(e.cli.Client().DaemonHost(), nil)
	maps.Copy(args, svc.Build.Args) // the profile's win over the proxy's
	auth := map[string]registry.AuthConfig{}
	if creds, err := e.cli.ConfigFile().GetAllCredentials(); err == nil {
		for k, c := range creds {
			auth[k] = registry.AuthConfig{Username: c.Username, Password: c.Password, ServerAddress: c.ServerAddress,
				Auth: c.Auth, IdentityToken: c.IdentityToken, RegistryToken: c.RegistryToken}
		}
	}
	res, err := e.cli.Client().ImageBuild(ctx, body, client.ImageBuildOptions{
		Version:     buildtypes.BuilderV1,
		Tags:        []string{svc.Image},
		Dockerfile:  dockerfile,
		Target:      svc.Build.Target,
		BuildArgs:   args,
		AuthConfigs: auth,
		Remove:      true,
		ForceRemove: true,
	})
	if err != nil {
		return fmt.Errorf("building %s: %w", svc.Image, err)
	}
	defer res.Body.Close()
	out := e.cli.Err()
	err = jsonmessage.DisplayJSONMessagesStream(res.Body, out, out.FD(), out.IsTerminal(), nil)
	var jerr *jsonstream.Error
	if errors.As(err, &jerr) {
		return &BuildError{Image: svc.Image, Msg: strings.TrimSpace(jerr.Message)}
	}
	if err != nil {
		return fmt.Errorf("building %s: reading the engine's answer: %w", svc.Image, err)
	}
	return nil
}

// BuildError is a build the engine ran and that failed: a step, or the
// base image it could not get.
type BuildError struct {
	Image string
	Msg   string // the engine's words
}

func (e *BuildError) Error() string { return fmt.Sprintf("building %s: %s", e.Image, e.Msg) }

// buildContext is the tar stream of the context directory dir, as `docker
// build` sends it (less what .dockerignore excludes, owned by root), and
// the Dockerfile's path in it: dockerfile relative to dir (Dockerfile when
// empty), or absolute; one outside dir is added to the stream.
func buildContext(dir, dockerfile string) (io.ReadCloser, string, error) {
	if dockerfile != "" && !filepath.IsAbs(dockerfile) {
		dockerfile = filepath.Join(dir, dockerfile)
	}
	dir, rel, err := build.GetContextFromLocalDir(dir, dockerfile)
	if err != nil {
		return nil, "", err
	}
	excludes, err := build.ReadDockerignore(dir)
	if err != nil {
		return nil, "", err
	}
	if err := build.ValidateContextDirectory(dir, excludes); err != nil {
		return nil, "", fmt.Errorf("checking the context %s: %w", dir, err)
	}
	rel = filepath.ToSlash(rel)
	outside := strings.HasPrefix(rel, "../")
	excludes = build.TrimBuildFilesFromExcludes(excludes, rel, false)
	tar, err := archive.TarWithOptions(dir, &archive.TarOptions{ExcludePatterns: excludes, ChownOpts: &archive.ChownOpts{UID: 0, GID: 0}})
	if err != nil {
		return nil, "", fmt.Errorf("reading the context %s: %w", dir, err)
	}
	if !outside {
		return tar, rel, nil
	}
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(rel)))
	if err != nil {
		tar.Close()
		return nil, "", err
	}
	return build.AddDockerfileToBuildContext(f, tar)
}
