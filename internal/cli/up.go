package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/internal/daemon"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

// upFlags are up's: run's, and the sandbox's name.
type upFlags struct {
	runFlags
	name string
}

func (f *upFlags) register(cmd *cobra.Command) {
	f.runFlags.register(cmd)
	cmd.Flags().StringVar(&f.name, "name", "", "the sandbox's `NAME` (default: the directory's, as run names its sandbox)")
}

func newUp(a *app) *cobra.Command {
	var f upFlags
	cmd := &cobra.Command{
		Use:   "up [-p PROFILE] [--name NAME] [--build] [--changeset [--resume ID]]",
		Short: "Start a persistent sandbox of the current directory, for exec to run commands in",
		Long: `Start a persistent sandbox of the current directory: the sandbox run would make
(same profile, isolation, gateway, decision log, checks, changeset mode), which
outlives this command and the terminal it runs in. It prints the sandbox's name.

exec [NAME] -- CMD runs a command in it; stop and start stop it and start it again,
keeping what it wrote; down removes it and all it made; ls shows it. Its supervisor,
in the background, removes it after resources.idle with no command run (default 30m).
Without --name, the directory's sandbox: up again prints its name.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.up(f) },
	}
	f.register(cmd)
	return cmd
}

// upWait bounds how long up waits for its supervisor to end after up was
// interrupted (it removes what it made, as run does).
const upWait = 3 * time.Minute

func (a *app) up(f upFlags) error {
	if f.name != "" {
		if err := sandbox.CheckName(f.name); err != nil {
			return usageError{err}
		}
	}
	e, err := loadEnv()
	if err != nil {
		return err
	}
	if done, err := a.upAlready(e, f.name); done || err != nil {
		return err
	}
	id := sandbox.NewKeepID()
	log, err := sandbox.KeepLog(e.dirs, id)
	if err != nil {
		return err
	}
	// Closing the terminal does not stop the sandbox coming up; Ctrl+C
	// does, and its supervisor removes what it made.
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	_, err = daemon.Start(ctx, daemon.Spec{Args: a.superviseArgs(f, id, log), Log: log, Progress: a.stderr, StopWait: upWait})
	if err != nil {
		os.Remove(log)
		return upFailed(ctx, err)
	}
	rec, err := sandbox.FindID(e.dirs, id)
	if err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, rec.Name)
	fmt.Fprintf(a.stderr, "%s: sandbox %s is up; run commands in it with `%s exec %s -- CMD`, remove it with `%s down %s`\n", name, rec.Name, name, rec.Name, name, rec.Name)
	return nil
}

// upAlready says whether the sandbox up asks for runs already (then it
// prints its name), or why up cannot make it: the directory's own, or the
// one named want.
func (a *app) upAlready(e env, want string) (bool, error) {
	var rec sandbox.Record
	var found bool
	var err error
	if want == "" {
		rec, found, err = sandbox.FindOwn(e.dirs, e.workspace)
	} else {
		rec, err = sandbox.Find(e.dirs, want, "")
		found = err == nil && rec.State != sandbox.StateGone // a gone one's name is free again
		var none *sandbox.NoSandboxError
		if errors.As(err, &none) {
			err = nil
		}
	}
	switch {
	case err != nil || !found:
		return false, err
	case rec.Workspace != e.workspace:
		return false, withHint(&sandbox.ExistsError{Name: rec.Name, State: rec.State, Workspace: rec.Workspace}, "give another --name, or remove it with `"+name+" down "+rec.Name+"`")
	case a.profile != "" && a.profile != rec.Ref:
		return false, withHint(fmt.Errorf("sandbox %s of this directory runs with the profile %s", rec.Name, rec.Profile), "remove it first (`"+name+" down "+rec.Name+"`), or make another with --name")
	case rec.State == sandbox.StateStopped:
		return false, withHint(fmt.Errorf("sandbox %s of this directory is stopped", rec.Name), "start it again with `"+name+" start "+rec.Name+"`, or remove it with `"+name+" down "+rec.Name+"`")
	}
	fmt.Fprintln(a.stdout, rec.Name)
	fmt.Fprintf(a.stderr, "%s: sandbox %s of this directory is %s already\n", name, rec.Name, rec.State)
	return true, nil
}

// upFailed is what up says when its supervisor did not bring the sandbox
// up: it has said why itself, with what to do.
func upFailed(ctx context.Context, err error) error {
	var f *daemon.Failure
	switch {
	case errors.As(err, &f):
		return exitCode(f.Code)
	case ctx.Err() != nil:
		return exitCode(130)
	}
	return err
}

// superviseArgs are the supervisor's arguments: up's own, and where it
// logs.
func (a *app) superviseArgs(f upFlags, id, log string) []string {
	args := []string{"supervise", "--id", id, "--log", log}
	if a.profile != "" {
		args = append(args, "-p", a.profile)
	}
	args = append(args, a.engineArgs()...)
	if f.name != "" {
		args = append(args, "--name", f.name)
	}
	if f.build {
		args = append(args, "--build")
	}
	if f.changeset {
		args = append(args, "--changeset")
	}
	if f.resume != "" {
		args = append(args, "--resume", f.resume)
	}
	for _, s := range f.skip {
		args = append(args, "--skip-checks", s)
	}
	return args
}
