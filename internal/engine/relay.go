package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/docker/compose/v5/pkg/api"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/internal/backend"
)

// Limits of a relay container: it copies bytes and holds a few sockets.
const (
	relayMemory = 64 << 20
	relayPIDs   = 64
)

// StartRelay creates and starts a container of r in the network namespace
// of the project's running container of r.Service: no network of its own,
// no capability, no new privileges, a read-only root, r.Dir its only mount.
func (e *Engine) StartRelay(ctx context.Context, r backend.Relay) (string, error) {
	c := e.cli.Client()
	agent, err := e.runningContainer(ctx, r.Project, r.Service)
	if err != nil {
		return "", err
	}
	pids := int64(relayPIDs)
	host := &container.HostConfig{
		NetworkMode:    container.NetworkMode("container:" + agent),
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges:true"},
		ReadonlyRootfs: true,
		Mounts:         []mount.Mount{{Type: mount.TypeBind, Source: r.Dir, Target: r.Target}},
		Resources:      container.Resources{Memory: relayMemory, PidsLimit: &pids},
	}
	if r.KeepID {
		host.UsernsMode = "keep-id"
	}
	res, err := c.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:  r.Image,
			Cmd:    r.Command,
			User:   r.User,
			Labels: r.Labels,
			Env:    []string{"GIT_DISCOVERY_ACROSS_FILESYSTEM=1"},
		},
		HostConfig: host,
	})
	if err != nil {
		return "", fmt.Errorf("creating the relay container: %w", err)
	}
	if _, err := c.ContainerStart(ctx, res.ID, client.ContainerStartOptions{}); err != nil {
		e.RemoveContainer(context.WithoutCancel(ctx), res.ID)
		return "", fmt.Errorf("starting the relay container: %w", err)
	}
	return res.ID, nil
}

// Running reports whether the project has a running container of service.
func (e *Engine) Running(ctx context.Context, project, service string) (bool, error) {
	list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
		Filters: make(client.Filters).
			Add("label", LabelProject+"="+project).
			Add("label", api.ServiceLabel+"="+service).
			Add("status", "running"),
	})
	if err != nil {
		return false, fmt.Errorf("listing containers: %w", err)
	}
	return len(list.Items) > 0, nil
}

// RemoveContainer removes the container id, running or not.
func (e *Engine) RemoveContainer(ctx context.Context, id string) error {
	_, err := e.cli.Client().ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true})
	if err != nil && !gone(err) {
		return fmt.Errorf("removing container %s: %w", id[:min(12, len(id))], err)
	}
	return nil
}

// runningContainer is the id of the project's running container of
// service. The engine may say one that has just started is running a
// moment after its process does: a created one is waited for, a bounded
// time.
func (e *Engine) runningContainer(ctx context.Context, project, service string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
			All: true,
			Filters: make(client.Filters).
				Add("label", LabelProject+"="+project).
				Add("label", api.ServiceLabel+"="+service),
		})
		if err != nil {
			return "", fmt.Errorf("finding the sandbox's container: %w", err)
		}
		starting := false
		for _, c := range list.Items {
			switch c.State {
			case container.StateRunning:
				return c.ID, nil
			case container.StateCreated, container.StateRestarting:
				starting = true
			}
		}
		if !starting {
			return "", fmt.Errorf("sandbox %s has no running %s container", project, service)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("sandbox %s has no running %s container: %w", project, service, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
