package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/compose/v5/pkg/api"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// apiClient is the engine client the Compose SDK uses, with two hooks.
//
// The SDK forwards the launcher's signals to the sandbox with ContainerKill,
// which fails on a container that is created but not started yet, and the
// signal would be lost (the sandbox would then run on, its Ctrl+C ignored).
// The first hook hears of that failure, so Run can stop the unstarted
// sandbox.
//
// The second keeps which projects' one-off containers (the sandbox's
// command) have been started: once started, a container that is gone has
// ended, and was not "not created yet", which a list of the engine's
// containers cannot tell apart.
//
// And it answers the Compose SDK's inspections of a one-off container
// between its create and its start (three: the create's own, the run's,
// and the start's) with the engine's first answer: nothing changes a
// container that is created and not started, and each inspection is a
// round trip the sandbox's start waits for.
//
// createBudget bounds a create the launcher has given up, and the removal
// of what it made.
const createBudget = 30 * time.Second

type apiClient struct {
	client.APIClient
	mu         sync.Mutex
	notRunning func(signal string)
	onStarted  func(name string)
	oneOffs    map[string]oneOff // by the one-off container's ID
	started    map[string]bool   // projects whose one-off has been started
	// unstarted are the inspections of one-offs that are created and not
	// started yet, as the engine gave them (JSON), by container ID.
	unstarted map[string]json.RawMessage
}

// oneOff is a one-off container created through the client.
type oneOff struct{ project, name string }

// ContainerCreate finishes a create that the launcher gives up (a signal
// cancels the run's context while the request is with the engine), and
// removes what it made: the engine makes the container all the same, and
// would do it after the teardown has looked for the project's containers.
func (c *apiClient) ContainerCreate(ctx context.Context, opts client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createBudget)
	defer cancel()
	res, err := c.APIClient.ContainerCreate(cctx, opts)
	if err == nil && ctx.Err() != nil {
		c.APIClient.ContainerRemove(cctx, res.ID, client.ContainerRemoveOptions{Force: true})
		return client.ContainerCreateResult{}, ctx.Err()
	}
	if err == nil && opts.Config != nil && opts.Config.Labels[api.OneoffLabel] == "True" {
		c.mu.Lock()
		if c.oneOffs == nil {
			c.oneOffs = map[string]oneOff{}
		}
		c.oneOffs[res.ID] = oneOff{project: opts.Config.Labels[api.ProjectLabel], name: opts.Name}
		c.mu.Unlock()
	}
	return res, err
}

// ContainerInspect answers for a one-off container that is created and not
// started with what the engine said of it first.
func (c *apiClient) ContainerInspect(ctx context.Context, id string, opts client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	c.mu.Lock()
	_, isOneOff := c.oneOffs[id]
	raw, known := c.unstarted[id]
	c.mu.Unlock()
	if known && !opts.Size {
		res := client.ContainerInspectResult{Raw: raw}
		// A copy of its own for each caller.
		if err := json.Unmarshal(raw, &res.Container); err == nil {
			return res, nil
		}
	}
	res, err := c.APIClient.ContainerInspect(ctx, id, opts)
	if err == nil && isOneOff && !opts.Size && res.Container.State != nil && res.Container.State.Status == container.StateCreated {
		c.mu.Lock()
		if !c.started[c.oneOffs[id].project] {
			if c.unstarted == nil {
				c.unstarted = map[string]json.RawMessage{}
			}
			c.unstarted[id] = slices.Clone(res.Raw)
		}
		c.mu.Unlock()
	}
	return res, err
}

// ContainerStart records the project's one-off as started as soon as its
// start is asked for: from then on the SDK forwards the launcher's signals
// to it (a kill that finds it not running yet goes to the notRunning hook),
// and the container may run, and print, before the engine has answered.
func (c *apiClient) ContainerStart(ctx context.Context, id string, opts client.ContainerStartOptions) (client.ContainerStartResult, error) {
	c.mu.Lock()
	one, isOneOff := c.oneOffs[id]
	delete(c.unstarted, id) // it changes from now on
	if isOneOff {
		if c.started == nil {
			c.started = map[string]bool{}
		}
		c.started[one.project] = true
	}
	c.mu.Unlock()
	res, err := c.APIClient.ContainerStart(ctx, id, opts)
	if isOneOff {
		c.mu.Lock()
		f := c.onStarted
		if err != nil {
			delete(c.started, one.project)
		}
		c.mu.Unlock()
		if err == nil && f != nil {
			f(one.name)
		}
	}
	return res, err
}

// whenStarted sets what to do once a one-off container has been started
// (its name given); nil to stop.
func (c *apiClient) whenStarted(f func(name string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onStarted = f
}

// oneOffStarted is whether the project's one-off container was started
// through this client.
func (c *apiClient) oneOffStarted(project string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started[project]
}

// onNotRunning sets what to do when a forwarded signal finds the sandbox not
// running; nil to stop listening.
func (c *apiClient) onNotRunning(f func(signal string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.notRunning = f
}

func (c *apiClient) ContainerKill(ctx context.Context, id string, opts client.ContainerKillOptions) (client.ContainerKillResult, error) {
	res, err := c.APIClient.ContainerKill(ctx, id, opts)
	if err != nil && cerrdefs.IsConflict(err) {
		c.mu.Lock()
		f := c.notRunning
		c.mu.Unlock()
		if f != nil {
			f(opts.Signal)
		}
	}
	return res, err
}

// NetworkCreate says that a network of the name was made meanwhile by
// someone else, which the Compose SDK would take for its own (it takes a
// conflict for "made by a concurrent compose up" and goes on): a sandbox
// network is made for one run, never shared (Engine.networksOurs).
func (c *apiClient) NetworkCreate(ctx context.Context, name string, opts client.NetworkCreateOptions) (client.NetworkCreateResult, error) {
	res, err := c.APIClient.NetworkCreate(ctx, name, opts)
	if err != nil && cerrdefs.IsConflict(err) {
		// Not wrapped: the SDK must not see a conflict.
		return res, fmt.Errorf("network %s was made by another launcher or program while this sandbox was starting (%v): run again", name, err)
	}
	return res, err
}

// ContainerList gives each container's networks by their IDs. Podman
// (4.3's Docker-compatible API) names a container's network by its name
// where the ID belongs; the Compose SDK, which compares a running
// container's networks with the IDs of the project's, would then take every
// running service for one on the wrong network, and recreate it: the holder
// of an allowlist sandbox's network namespace, say, after its fence was
// checked, with the gateway's address taken meanwhile.
func (c *apiClient) ContainerList(ctx context.Context, opts client.ContainerListOptions) (client.ContainerListResult, error) {
	res, err := c.APIClient.ContainerList(ctx, opts)
	if err != nil {
		return res, err
	}
	var ids map[string]string // network name -> ID, asked once when needed
	for _, s := range res.Items {
		if s.NetworkSettings == nil {
			continue
		}
		for name, ep := range s.NetworkSettings.Networks {
			if ep == nil || ep.NetworkID != name {
				continue
			}
			if ids == nil {
				nets, err := c.APIClient.NetworkList(ctx, client.NetworkListOptions{})
				if err != nil {
					return res, err
				}
				ids = map[string]string{}
				for _, n := range nets.Items {
					ids[n.Name] = n.ID
				}
			}
			if id, ok := ids[name]; ok {
				ep.NetworkID = id
			}
		}
	}
	return res, nil
}

// ContainerWait answers a wait that failed (its connection broke, or the
// engine said an error) with the container's state: its exit code when it
// has exited, else one more wait (until it is not running, or as asked
// when it has not started). The SDK would take the failure for exit status
// 125, the launcher's "the engine went away", and say nothing of it.
func (c *apiClient) ContainerWait(ctx context.Context, id string, opts client.ContainerWaitOptions) client.ContainerWaitResult {
	first := c.APIClient.ContainerWait(ctx, id, opts)
	resultC := make(chan container.WaitResponse, 1)
	errC := make(chan error, 1)
	go func() {
		var failed error
		select {
		case res := <-first.Result:
			if res.Error == nil {
				resultC <- res
				return
			}
			failed = fmt.Errorf("%s", res.Error.Message)
		case err := <-first.Error:
			if ctx.Err() != nil {
				errC <- err
				return
			}
			failed = err
		}
		res, err := c.APIClient.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil || res.Container.State == nil {
			errC <- fmt.Errorf("waiting for the container: %v; and then: %v", failed, err)
			return
		}
		cond := container.WaitConditionNotRunning // returns at once once it has stopped
		switch st := res.Container.State; {
		case st.Status == container.StateCreated:
			cond = opts.Condition // not started yet
		case !st.Running:
			resultC <- container.WaitResponse{StatusCode: int64(st.ExitCode)}
			return
		}
		again := c.APIClient.ContainerWait(ctx, id, client.ContainerWaitOptions{Condition: cond})
		select {
		case res := <-again.Result:
			resultC <- res
		case err := <-again.Error:
			errC <- fmt.Errorf("waiting for the container: %w (and before: %v)", err, failed)
		}
	}()
	return client.ContainerWaitResult{Result: resultC, Error: errC}
}
