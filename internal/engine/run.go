package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/compose-spec/compose-go/v2/types"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/cli/cli"
	"github.com/docker/compose/v5/pkg/api"
	"github.com/docker/compose/v5/pkg/compose"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	mobysignal "github.com/moby/sys/signal"
	"github.com/propio/propio-sandbox/internal/backend"
)

// The Docker and Podman engine is a backend.Runtime.
var _ backend.Runtime = (*Engine)(nil)

// Labels that tie a sandbox's resources to the launcher that made them.
const (
	LabelProject = backend.LabelProject
	LabelPID     = backend.LabelPID
	LabelHost    = backend.LabelHost
)

// Run runs the project's service as a one-off container, as `docker compose
// run` does, through the Compose SDK's RunOneOffContainer: the project's
// networks and the services it depends on (an allowlist's gateway) first,
// then the container created, started, attached to the launcher's streams
// (a terminal when o.TTY) and waited for. From its start, the SDK forwards
// the launcher's signals to it; one that finds it created but not started
// goes to o.NotRunning.
//
// The SDK does all of that in one call, with the docker CLI's terminal
// handling (raw mode, resizes, detach keys) between the start and the
// attach, so this Runtime does not split it.
func (e *Engine) Run(ctx context.Context, project *types.Project, o backend.RunSpec) (int, error) {
	svc, err := e.composeFor(o.Streams)
	if err != nil {
		return 0, err
	}
	project = withComposeLabels(project)
	if o.NotRunning != nil {
		e.api.onNotRunning(func(sig string) {
			s, err := mobysignal.ParseSignal(sig)
			if err != nil {
				s = syscall.SIGINT
			}
			o.NotRunning(s)
		})
		defer e.api.onNotRunning(nil)
	}
	if o.Started != nil {
		e.api.whenStarted(o.Started)
		defer e.api.whenStarted(nil)
	}
	if err := e.networksOurs(ctx, project); err != nil {
		return 0, err
	}
	code, err := svc.RunOneOffContainer(ctx, project, api.RunOptions{
		Project: project,
		Service: o.Service,
		// Not removed by the engine as it exits: the wait would last until
		// the engine has removed it (a tenth of a second on Docker; and
		// Podman before 4.6 reports exit code 0 to a wait for removal,
		// containers/podman#18889). The launch's Remove removes it, in the
		// background once the command has ended. A detached one is a
		// persistent sandbox's: kept when it stops.
		AutoRemove:  false,
		Detach:      o.Detach,
		Tty:         o.TTY && !o.Detach,
		Interactive: o.Interactive && !o.Detach,
		// The dependencies (an allowlist's gateway) start first.
		NoDeps: len(project.Services) == 1,
		// A gateway made ahead of the sandbox (Up) is not in the project
		// of the sandbox that runs on it, and is no orphan.
		CreateOptions: api.CreateOptions{IgnoreOrphans: true},
	})
	return code, runError(err, len(project.Services[o.Service].StorageOpt) > 0)
}

// Up creates the project's networks and starts its services, detached, as
// `docker compose up -d` does: an allowlist's gateway made ahead of the
// sandbox that will use it.
func (e *Engine) Up(ctx context.Context, project *types.Project) error {
	project = withComposeLabels(project)
	if err := e.networksOurs(ctx, project); err != nil {
		return err
	}
	if err := e.compose.Create(ctx, project, api.CreateOptions{}); err != nil {
		return runError(err, false)
	}
	if err := e.compose.Start(ctx, project.Name, api.StartOptions{Project: project}); err != nil {
		return runError(err, false)
	}
	return nil
}

// Exec runs a command in the running container of the project's service
// (the sandbox's one-off container too), through the Compose SDK's Exec, as
// `docker compose exec` does: attached to o.Streams, or the launcher's.
// The command's exit code, whatever it is, is no error.
func (e *Engine) Exec(ctx context.Context, project string, o backend.ExecSpec) (int, error) {
	svc, err := e.composeFor(o.Streams)
	if err != nil {
		return 0, err
	}
	code, err := svc.Exec(ctx, project, api.RunOptions{
		Service:     o.Service,
		Command:     o.Command,
		Tty:         o.TTY,
		Interactive: o.Interactive,
	})
	var status cli.StatusError
	if errors.As(err, &status) && status.StatusCode > 0 {
		// The SDK says an exit code above zero as an error.
		return status.StatusCode, nil
	}
	if err != nil {
		return 0, fmt.Errorf("running %v in %s's %s: %w", o.Command, project, o.Service, err)
	}
	return code, nil
}

// composeFor is the Compose service that attaches what it runs to s: the
// connection's, or, when s sets a stream, one over the same client with
// s's streams in place of the launcher's.
func (e *Engine) composeFor(s backend.Streams) (api.Compose, error) {
	if s.In == nil && s.Out == nil && s.Err == nil {
		return e.compose, nil
	}
	svc, err := compose.NewComposeService(e.cli, compose.WithStreams(s.Out, s.Err, s.In))
	if err != nil {
		return nil, fmt.Errorf("setting up compose: %w", err)
	}
	return svc, nil
}

// runError says which of the backend's sentinels the SDK's error is, if
// one: a refusal of the storage option (when the service had one), a
// subnet another network took meanwhile.
func runError(err error, storageOpt bool) error {
	switch {
	case err == nil:
		return nil
	case storageOpt && storageOptRefused(err):
		return classified{err, backend.ErrStorageOptRefused}
	case strings.Contains(err.Error(), "Pool overlaps"):
		return classified{err, backend.ErrSubnetTaken}
	}
	return err
}

// networksOurs refuses a project whose networks (those it makes: not
// external) exist already but were not made for it: by this launcher, or
// for the persistent sandbox it is. The Compose SDK would use a network
// of the name whoever made it, and the sandbox would share another's
// network: another launcher's sandbox of the same name (two launchers
// whose name locks are in different places, or on different hosts,
// claiming the name at the same moment), or a network of the user's.
// One made between this look and the SDK's create is refused by the
// client's NetworkCreate.
func (e *Engine) networksOurs(ctx context.Context, project *types.Project) error {
	for _, n := range project.Networks {
		if n.External {
			continue
		}
		res, err := e.cli.Client().NetworkInspect(ctx, n.Name, client.NetworkInspectOptions{})
		if cerrdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("looking for network %s: %w", n.Name, err)
		}
		if got := res.Network.Labels; networkOwner(got) != networkOwner(n.Labels) {
			by := "by something other than propio-sandbox"
			if got[LabelPID] != "" {
				by = fmt.Sprintf("for another sandbox of the name (launcher pid %s on host %s)", got[LabelPID], cmp.Or(got[LabelHost], "?"))
			}
			return fmt.Errorf("network %s exists already, made %s: this sandbox does not join it; run again, which picks another name while that sandbox runs, or remove the network (docker network rm %s) if nothing uses it", n.Name, by, n.Name)
		}
	}
	return nil
}

// networkOwner is whom a network's labels say it was made for.
func networkOwner(labels map[string]string) string {
	return labels[LabelPID] + "@" + labels[LabelHost] + "#" + labels[backend.LabelKeepID]
}

// classified is an engine's error that is one of the backend's sentinels,
// said as the engine said it.
type classified struct {
	err  error
	kind error
}

func (c classified) Error() string        { return c.err.Error() }
func (c classified) Unwrap() []error      { return []error{c.err, c.kind} }
func (c classified) Is(target error) bool { return target == c.kind }

// withComposeLabels gives each service of a copy of the project the labels
// the Compose loader would add, by which the SDK finds the containers it
// created (the gateway's, started before the one-off). The copy shares all
// but its services' labels with project.
func withComposeLabels(project *types.Project) *types.Project {
	p := *project
	p.Services = make(types.Services, len(project.Services))
	for name, s := range project.Services {
		s.CustomLabels = types.Labels{
			api.ProjectLabel:    p.Name,
			api.ServiceLabel:    name,
			api.VersionLabel:    api.ComposeVersion,
			api.WorkingDirLabel: p.WorkingDir,
			api.OneoffLabel:     "False",
		}
		p.Services[name] = s
	}
	return &p
}

// Kill kills the project's running containers at once.
func (e *Engine) Kill(ctx context.Context, project string) error {
	list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
		Filters: make(client.Filters).Add("label", LabelProject+"="+project),
	})
	if err != nil {
		return fmt.Errorf("listing containers: %w", err)
	}
	for _, c := range list.Items {
		e.cli.Client().ContainerKill(ctx, c.ID, client.ContainerKillOptions{Signal: "KILL"})
	}
	return nil
}

// StopUnstarted stops a sandbox whose command has not started yet: the
// containers of the project that are created but not started are removed,
// and it reports true, also while an allowlist's gateway already runs (the
// teardown removes it). Once the one-off container has been started it
// gets the launcher's signals from the SDK, and is left alone, also when it
// has ended and is gone already.
func (e *Engine) StopUnstarted(ctx context.Context, project string) bool {
	if e.api.oneOffStarted(project) {
		return false
	}
	list, err := e.cli.Client().ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelProject+"="+project),
	})
	if err != nil {
		return true // cannot tell: stopping is the safe answer to a signal
	}
	stopped := true
	for _, c := range list.Items {
		if c.Labels[api.OneoffLabel] == "True" && c.State != container.StateCreated {
			stopped = false // started through another client
			continue
		}
		if c.State == container.StateCreated {
			e.cli.Client().ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
		}
	}
	return stopped
}
