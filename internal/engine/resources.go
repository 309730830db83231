package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
)

// Remove deletes every container, network and volume labelled with the
// sandbox project, running or not: all of them, or, when launcher is above
// zero, those the launcher with that pid made. Removing what is already
// gone is not an error.
func (e *Engine) Remove(ctx context.Context, project string, launcher int) error {
	by := make(client.Filters).Add("label", LabelProject+"="+project)
	if launcher > 0 {
		by = by.Add("label", LabelPID+"="+strconv.Itoa(launcher))
	}
	return e.removeBy(ctx, by)
}

// removeBy deletes every container, network and volume the filters select.
func (e *Engine) removeBy(ctx context.Context, by client.Filters) error {
	c := e.cli.Client()
	var errs []error
	containers, err := c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: by})
	if err != nil {
		return fmt.Errorf("listing containers: %w", err)
	}
	image := ""
	for _, ctr := range containers.Items {
		if image == "" {
			image = ctr.Image
		}
	}
	// In passes: Podman refuses to remove a container that others joined
	// the network namespace of (a fenced sandbox's holder) before they are
	// gone, and its list does not say which joined which.
	left := containers.Items
	for len(left) > 0 {
		var failed []container.Summary
		var failures []error
		for _, ctr := range left {
			if _, err := c.ContainerRemove(ctx, ctr.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !gone(err) {
				failed = append(failed, ctr)
				failures = append(failures, fmt.Errorf("removing container %s: %w", ctr.ID[:12], err))
			}
		}
		if len(failed) == len(left) {
			errs = append(errs, failures...)
			break
		}
		left = failed
	}
	// AutoRemove may still be removing the container; the network cannot go
	// before it does.
	if err := e.waitGone(ctx, by); err != nil {
		errs = append(errs, err)
	}
	networks, err := c.NetworkList(ctx, client.NetworkListOptions{Filters: by})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("listing networks: %w", err))...)
	}
	for _, n := range networks.Items {
		if _, err := c.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{}); err != nil && !gone(err) {
			errs = append(errs, fmt.Errorf("removing network %s: %w", n.Name, err))
		}
	}
	volumes, err := c.VolumeList(ctx, client.VolumeListOptions{Filters: by})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("listing volumes: %w", err))...)
	}
	for _, v := range volumes.Items {
		if img := cmp.Or(v.Labels[LabelHelperImage], image); v.Options["type"] == "overlay" && img != "" {
			// Best effort: what it would remove is only clutter.
			e.settleOverlay(ctx, img, v.Labels, v.Name)
		}
		if err := e.removeVolume(ctx, v.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeVolume removes a volume of a sandbox, waiting, when it is in use by
// helper containers only, until they are gone. Two removals of one sandbox
// may run at once (gc, and a launch removing the leftovers of killed
// launchers, both find it): each mounts an overlay volume once more with a
// helper before removing it (settleOverlay), and the other removal finds
// the volume in use by that helper, which its removal removes at once.
// A volume in use by any other container stays, and is an error.
func (e *Engine) removeVolume(ctx context.Context, name string) error {
	c := e.cli.Client()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true})
		if err == nil || gone(err) {
			return nil
		}
		if !cerrdefs.IsConflict(err) || time.Now().After(deadline) {
			return fmt.Errorf("removing volume %s: %w", name, err)
		}
		users := make(client.Filters).Add("volume", name)
		list, lerr := c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: users})
		if lerr != nil {
			return fmt.Errorf("removing volume %s: %w (listing the containers that use it: %v)", name, err, lerr)
		}
		for _, ctr := range list.Items {
			if ctr.Labels[labelHelper] == "" {
				return fmt.Errorf("removing volume %s: %w", name, err)
			}
		}
		if werr := e.waitGone(ctx, users.Add("label", labelHelper)); werr != nil {
			return fmt.Errorf("removing volume %s: %w (waiting for the helpers that use it: %v)", name, err, werr)
		}
	}
}

// gone reports whether a removal failed only because the thing is gone, or
// is being removed by someone else (AutoRemove, or another gc).
func gone(err error) bool {
	return cerrdefs.IsNotFound(err) || cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "already in progress")
}

// waitGone waits, a bounded time, until no container matches filters.
func (e *Engine) waitGone(ctx context.Context, filters client.Filters) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{All: true, Filters: filters})
		if err != nil {
			return fmt.Errorf("listing containers: %w", err)
		}
		if len(list.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d containers still present after 30s", len(list.Items))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Sandbox is one sandbox the engine knows of, from its labels.
type Sandbox = backend.Sandbox

// List returns the sandboxes on the engine, oldest first.
func (e *Engine) List(ctx context.Context) ([]Sandbox, error) {
	c := e.cli.Client()
	mine := make(client.Filters).Add("label", LabelProject)
	found := map[string]*Sandbox{}
	add := func(labels map[string]string, state string, created time.Time) {
		// A name is reused once its launcher is gone: a sandbox is a name
		// and a launcher.
		name := labels[LabelProject]
		key := name + "\x00" + labels[LabelHost] + "\x00" + labels[LabelPID]
		if s, ok := found[key]; ok {
			if s.State == "leftover" {
				s.State = state
			}
			return
		}
		pid, _ := strconv.Atoi(labels[LabelPID])
		found[key] = &Sandbox{
			Project: name, Workspace: labels[generator.LabelWorkspace], Profile: labels[generator.LabelProfile],
			PID: pid, Host: labels[LabelHost], Alive: LauncherAlive(pid, labels[LabelHost]),
			State: state, Created: created, Prepared: labels[backend.LabelPrepared] != "",
			Keep: labels[backend.LabelKeep], KeepID: labels[backend.LabelKeepID],
		}
	}
	containers, err := c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: mine})
	if err != nil {
		return nil, fmt.Errorf("listing containers: %w", err)
	}
	for _, ctr := range containers.Items {
		add(ctr.Labels, string(ctr.State), time.Unix(ctr.Created, 0))
	}
	networks, err := c.NetworkList(ctx, client.NetworkListOptions{Filters: mine})
	if err != nil {
		return nil, fmt.Errorf("listing networks: %w", err)
	}
	for _, n := range networks.Items {
		add(n.Labels, "leftover", n.Created)
	}
	volumes, err := c.VolumeList(ctx, client.VolumeListOptions{Filters: mine})
	if err != nil {
		return nil, fmt.Errorf("listing volumes: %w", err)
	}
	for _, v := range volumes.Items {
		created, _ := time.Parse(time.RFC3339, v.CreatedAt)
		add(v.Labels, "leftover", created)
	}
	out := make([]Sandbox, 0, len(found))
	for _, s := range found {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].Project < out[j].Project
	})
	return out, nil
}

// LauncherAlive reports whether the launcher pid still runs on this host. On
// another host it cannot tell, and says alive so that nothing is removed.
func LauncherAlive(pid int, host string) bool { return backend.LauncherAlive(pid, host) }
