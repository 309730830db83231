package engine

import (
	"context"
	"fmt"
	"math"

	"github.com/docker/compose/v5/pkg/api"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/internal/backend"
)

// UpdateResources changes the limits of the running container of the
// project's service (the one-off container Run started), live. A memory
// limit keeps the swap it had beside it: the engine refuses a memory limit
// above the container's memory+swap limit, so that one is raised as much.
func (e *Engine) UpdateResources(ctx context.Context, project, service string, r backend.Resources) error {
	c := e.cli.Client()
	list, err := c.ContainerList(ctx, client.ContainerListOptions{
		Filters: make(client.Filters).Add("label", LabelProject+"="+project).Add("label", api.ServiceLabel+"="+service),
	})
	if err != nil {
		return fmt.Errorf("finding the sandbox's container: %w", err)
	}
	if len(list.Items) == 0 {
		return fmt.Errorf("the sandbox %s has no running %s container", project, service)
	}
	id := list.Items[0].ID
	var res container.Resources
	if r.CPUs > 0 {
		res.NanoCPUs = int64(math.Round(r.CPUs * 1e9))
	}
	if r.PIDs > 0 {
		res.PidsLimit = &r.PIDs
	}
	if r.Memory > 0 {
		ins, err := c.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil {
			return fmt.Errorf("inspecting the sandbox's container: %w", err)
		}
		res.Memory = r.Memory
		if hc := ins.Container.HostConfig; hc != nil && hc.MemorySwap > 0 && hc.Memory > 0 {
			res.MemorySwap = r.Memory + (hc.MemorySwap - hc.Memory)
		}
	}
	if _, err := c.ContainerUpdate(ctx, id, client.ContainerUpdateOptions{Resources: &res}); err != nil {
		return fmt.Errorf("updating the limits of %s's %s: %w", project, service, err)
	}
	return nil
}
