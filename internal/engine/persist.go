package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/docker/compose/v5/pkg/api"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/gatewayimage"
)

// What a persistent sandbox's supervisor asks of the engine besides a
// run's: its containers found, waited for, started again and stopped.

// stopTimeout is how long Stop lets a container end on SIGTERM before the
// engine kills it. The agent's main process is the launcher's keeper,
// which ends at once.
const stopTimeout = 10

// Container is the ID of the container of the project's service, running
// or not; "" when there is none. An engine that does not take new
// connections (it is away, or stopping) is an error wrapping
// backend.ErrEngineGone, whatever its old connections still answer.
func (e *Engine) Container(ctx context.Context, project, service string) (string, error) {
	if !e.reachable() {
		return "", classified{fmt.Errorf("the engine at %s does not answer", e.Host), backend.ErrEngineGone}
	}
	list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
		All: true,
		Filters: make(client.Filters).Add("label", LabelProject+"="+project).
			Add("label", api.ServiceLabel+"="+service),
	})
	if err != nil {
		return "", e.goneOr(fmt.Errorf("finding the container of %s's %s: %w", project, service, err))
	}
	if len(list.Items) == 0 {
		return "", nil
	}
	return list.Items[0].ID, nil
}

// Wait waits until the container of the project's service is not running
// and returns its exit code. An engine that stops answering meanwhile (its
// API closes when it is stopped, before it stops its containers) is an
// error wrapping backend.ErrEngineGone.
func (e *Engine) Wait(ctx context.Context, project, service string) (int, error) {
	id, err := e.Container(ctx, project, service)
	if err != nil {
		return 0, err
	}
	if id == "" {
		return 0, fmt.Errorf("%s has no %s container", project, service)
	}
	w := e.cli.Client().ContainerWait(ctx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case res := <-w.Result:
		if res.Error != nil && res.Error.Message != "" {
			return 0, e.goneOr(fmt.Errorf("waiting for %s: %s", project, res.Error.Message))
		}
		// A Docker that is stopped closes its listener first, then stops
		// its containers while it still serves the connections it had:
		// the container ended because the engine goes away.
		if !e.reachable() {
			return 0, classified{fmt.Errorf("%s stopped with the engine (exit %d)", project, res.StatusCode), backend.ErrEngineGone}
		}
		return int(res.StatusCode), nil
	case err := <-w.Error:
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, e.goneOr(fmt.Errorf("waiting for %s: %w", project, err))
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// goneOr is err, wrapping backend.ErrEngineGone when the engine does not
// answer a ping now.
func (e *Engine) goneOr(err error) error {
	if !e.reachable() {
		return classified{err, backend.ErrEngineGone}
	}
	return err
}

// reachable reports whether the engine answers a ping on a new connection
// (Reachable): one that is stopping still serves those it had, not new
// ones. When it does not, the client's idle connections go: they are to
// an engine that is gone, or going.
func (e *Engine) reachable() bool {
	if err := e.Reachable(context.Background()); err != nil {
		e.cli.Client().Close() // its idle connections; it goes on working
		return false
	}
	return true
}

// Start starts the containers of the project's services that are not
// running, the services' the agent depends on first, then the agent's
// (when the project has it), each once the one before is running. Containers that are not a service's (an agent's
// port relays) are left as they are.
func (e *Engine) Start(ctx context.Context, project *types.Project) error {
	list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelProject+"="+project.Name),
	})
	if err != nil {
		return e.goneOr(fmt.Errorf("listing the containers of %s: %w", project.Name, err))
	}
	var first, agent []container.Summary
	for _, c := range list.Items {
		switch svc := c.Labels[api.ServiceLabel]; {
		case svc == "" || project.Services[svc].Name == "":
			// Not one of the services to start.
		case svc == generator.Service:
			agent = append(agent, c)
		default:
			first = append(first, c)
		}
	}
	if _, ok := project.Services[generator.Service]; ok && len(agent) == 0 {
		return fmt.Errorf("%s has no %s container to start", project.Name, generator.Service)
	}
	for i, c := range append(first, agent...) {
		if i == len(first) {
			// The agent's namespace is fenced in again before it joins it.
			if err := e.fenced(ctx, project); err != nil {
				return err
			}
		}
		if c.State == container.StateRunning {
			continue
		}
		if _, err := e.cli.Client().ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
			return e.goneOr(fmt.Errorf("starting %s's %s: %w", project.Name, c.Labels[api.ServiceLabel], err))
		}
	}
	return nil
}

// fenced has the holder of the agent's network namespace, when the project
// has one (generator.NetnsService), say that it has fenced it in (waiting
// for it a bounded time): an error when it has not.
func (e *Engine) fenced(ctx context.Context, project *types.Project) error {
	n, ok := project.Services[generator.NetnsService]
	if !ok {
		return nil
	}
	var out strings.Builder
	code, err := e.Exec(ctx, project.Name, backend.ExecSpec{Service: generator.NetnsService, Command: generator.FenceCheck(n, gatewayimage.Binary), Streams: backend.Streams{Out: &out, Err: &out}})
	switch {
	case err != nil:
		return fmt.Errorf("checking the fence of %s's network namespace: %w", project.Name, err)
	case code != 0:
		return fmt.Errorf("%s's network namespace is not fenced in (exit %d): %s", project.Name, code, strings.TrimSpace(out.String()))
	}
	return nil
}

// Stop stops the project's running containers, the agent's first (then
// nothing of the sandbox's runs in the others' namespaces), and keeps them.
func (e *Engine) Stop(ctx context.Context, project string) error {
	list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
		Filters: make(client.Filters).Add("label", LabelProject+"="+project),
	})
	if err != nil {
		return e.goneOr(fmt.Errorf("listing the containers of %s: %w", project, err))
	}
	var agent, rest []container.Summary
	for _, c := range list.Items {
		if c.Labels[api.ServiceLabel] == generator.Service {
			agent = append(agent, c)
		} else {
			rest = append(rest, c)
		}
	}
	timeout := stopTimeout
	var errs []error
	for _, c := range append(agent, rest...) {
		if _, err := e.cli.Client().ContainerStop(ctx, c.ID, client.ContainerStopOptions{Timeout: &timeout}); err != nil && !gone(err) {
			errs = append(errs, fmt.Errorf("stopping %s: %w", c.Names, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return e.goneOr(err)
	}
	return nil
}
