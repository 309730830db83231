package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"

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
	if e.Kind == Podman {
		// Podman's Docker-compatible API has no update; its own does.
		err = podmanUpdate(ctx, e.Host, id, res)
	} else {
		_, err = c.ContainerUpdate(ctx, id, client.ContainerUpdateOptions{Resources: &res})
	}
	if err != nil {
		return fmt.Errorf("updating the limits of %s's %s: %w", project, service, err)
	}
	return nil
}

// podmanUpdate changes the container's limits through Podman's own API,
// which takes them as the OCI runtime specification writes them.
func podmanUpdate(ctx context.Context, host, id string, res container.Resources) error {
	type memory struct {
		Limit *int64 `json:"limit,omitempty"`
		Swap  *int64 `json:"swap,omitempty"`
	}
	type cpu struct {
		Quota  *int64  `json:"quota,omitempty"`
		Period *uint64 `json:"period,omitempty"`
	}
	type pids struct {
		Limit int64 `json:"limit"`
	}
	var body struct {
		Memory *memory `json:"memory,omitempty"`
		CPU    *cpu    `json:"cpu,omitempty"`
		Pids   *pids   `json:"pids,omitempty"`
	}
	if res.Memory > 0 {
		body.Memory = &memory{Limit: &res.Memory}
		if res.MemorySwap > 0 {
			body.Memory.Swap = &res.MemorySwap
		}
	}
	if res.NanoCPUs > 0 {
		period := uint64(100000)
		quota := res.NanoCPUs * int64(period) / 1e9
		body.CPU = &cpu{Quota: &quota, Period: &period}
	}
	if res.PidsLimit != nil {
		body.Pids = &pids{Limit: *res.PidsLimit}
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	hc, base := podmanAPI(host)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v4.0.0/libpod/containers/"+url.PathEscape(id)+"/update", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("podman: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}
