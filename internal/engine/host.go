package engine

import (
	"context"
	"fmt"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
)

// DockerDesktop reports whether the engine is Docker Desktop, from its info.
func (e *Engine) DockerDesktop(ctx context.Context) (bool, error) {
	res, err := e.cli.Client().Info(ctx, client.InfoOptions{})
	if err != nil {
		return false, fmt.Errorf("reading the engine's info: %w", err)
	}
	return strings.Contains(res.Info.OperatingSystem, "Docker Desktop"), nil
}

// PathExists reports whether path exists where the engine runs containers
// (its VM, for Docker Desktop): it creates a container of image with path
// bind-mounted, which the engine refuses when the path is missing, and
// removes it at once. Nothing is started.
func (e *Engine) PathExists(ctx context.Context, image, path string) (bool, error) {
	c := e.cli.Client()
	res, err := c.ContainerCreate(ctx, client.ContainerCreateOptions{
		Image:  image,
		Config: &container.Config{Labels: map[string]string{LabelImage: "path-probe"}},
		HostConfig: &container.HostConfig{
			Mounts:     []mount.Mount{{Type: mount.TypeBind, Source: path, Target: "/probe", ReadOnly: true}},
			AutoRemove: false,
		},
	})
	if err != nil {
		if cerrdefs.IsInvalidArgument(err) || strings.Contains(err.Error(), "does not exist") {
			return false, nil
		}
		return false, fmt.Errorf("checking %s on the engine: %w", path, err)
	}
	_, _ = c.ContainerRemove(ctx, res.ID, client.ContainerRemoveOptions{Force: true})
	return true, nil
}
