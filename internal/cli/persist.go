package cli

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"

	"github.com/propio/propio-sandbox/internal/daemon"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

// The commands of a persistent sandbox besides up and exec: down, stop,
// start.

func newDown(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "down [NAME]",
		Short: "Remove a persistent sandbox (this directory's, or NAME) and all it made",
		Long: `Remove a persistent sandbox and everything it made (containers, networks, volumes),
as a run's end does: what it wrote in changeset mode becomes a changeset to review,
and what it left that git would run is put aside. Running or stopped, or gone
(then its record is forgotten).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return a.down(sandboxName(args)) },
	}
}

func (a *app) down(want string) error {
	e, rec, err := a.persistent(want)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if supervised(rec) {
		if _, err := sandbox.Control(ctx, e.dirs, rec, false, a.stderr); err != nil {
			return err
		}
		sandbox.Forget(e.dirs, rec)
	} else {
		err := a.withEngineOf(rec.Engine, func(ctx context.Context, c *sandbox.Conn) error {
			return sandbox.Down(ctx, e.sandbox(), rec, c, reporter{a.stderr}, a.stderr)
		})
		if err != nil {
			return err
		}
	}
	fmt.Fprintf(a.stdout, "removed %s\n", rec.Name)
	return nil
}

func newStop(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "stop [NAME]",
		Short: "Stop a persistent sandbox (this directory's, or NAME), keeping what it wrote; start resumes it",
		Long: `Stop a persistent sandbox: its containers (and its gateway) stop and its supervisor
ends, so that nothing of it holds CPU or memory; its writable layer, volumes and
changeset are kept. start runs it again; down removes it.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return a.stop(sandboxName(args)) },
	}
}

func (a *app) stop(want string) error {
	e, rec, err := a.persistent(want)
	if err != nil {
		return err
	}
	switch {
	case rec.State == sandbox.StateStopped:
		fmt.Fprintf(a.stderr, "%s: sandbox %s is stopped already\n", name, rec.Name)
		return nil
	case rec.State == sandbox.StateGone:
		return persistHint(&sandbox.NotRunningError{Name: rec.Name, State: rec.State, Why: rec.Why})
	case supervised(rec):
		rec, err = sandbox.Control(context.Background(), e.dirs, rec, true, a.stderr)
	default:
		err = a.withEngineOf(rec.Engine, func(ctx context.Context, c *sandbox.Conn) error {
			return sandbox.StopUnsupervised(ctx, c, reporter{a.stderr}, e.dirs, rec)
		})
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "stopped %s\n", rec.Name)
	return nil
}

func newStart(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "start [NAME]",
		Short: "Start a stopped persistent sandbox (this directory's, or NAME) again",
		Long: `Start a stopped persistent sandbox again, as it was: its containers, with what they
wrote, and a supervisor that watches it as up's did (idle timeout, disk cap, timeout,
gateway log, agent requests). Its profile is read again for what the supervisor
serves; the containers are what up made.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return a.start(sandboxName(args)) },
	}
}

func (a *app) start(want string) error {
	_, rec, err := a.persistent(want)
	if err != nil {
		return err
	}
	switch {
	case supervised(rec):
		fmt.Fprintf(a.stderr, "%s: sandbox %s is %s already\n", name, rec.Name, rec.State)
		return nil
	case rec.State == sandbox.StateGone:
		return persistHint(&sandbox.NotRunningError{Name: rec.Name, State: rec.State, Why: rec.Why})
	}
	args := []string{"supervise", "--start", rec.Name}
	args = append(args, a.engineArgs()...)
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	_, err = daemon.Start(ctx, daemon.Spec{Args: args, Log: rec.Log, Dir: rec.Workspace, Progress: a.stderr, StopWait: upWait})
	if err != nil {
		return upFailed(ctx, err)
	}
	fmt.Fprintf(a.stdout, "started %s\n", rec.Name)
	return nil
}

// persistent is the environment and the record of the persistent sandbox
// want names, or of this directory's.
func (a *app) persistent(want string) (env, sandbox.Record, error) {
	e, err := loadEnv()
	if err != nil {
		return env{}, sandbox.Record{}, err
	}
	rec, err := sandbox.Find(e.dirs, want, e.workspace)
	if err != nil {
		return e, rec, persistHint(err)
	}
	return e, rec, nil
}

// supervised: a supervisor holds the sandbox now.
func supervised(rec sandbox.Record) bool {
	return rec.Supervised() && rec.State != sandbox.StateStopped && rec.State != sandbox.StateGone
}
