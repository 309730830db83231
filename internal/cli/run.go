package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/moby/term"
	"github.com/propio/propio-sandbox/internal/initgc"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

// runFlags are the flags of run, which the root command shares (run is the default).
type runFlags struct {
	build     bool
	skip      []string
	changeset bool
	resume    string
}

func (f *runFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.build, "build", false, "build the profile's image first (when it has a build section)")
	cmd.Flags().StringArrayVar(&f.skip, "skip-checks", nil, "skip the profile's declared check `NAME` for this run (never a built-in one)")
	cmd.Flags().BoolVar(&f.changeset, "changeset", false, "write to a changeset instead of the workspace (workspace.mode changeset): review it with diff, then apply or discard it")
	cmd.Flags().StringVar(&f.resume, "resume", "", "with --changeset: continue the changeset `ID` (or a unique prefix) instead of starting one")
}

func newRun(a *app) *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [-p PROFILE] [--build] [--changeset [--resume ID]] [-- CMD...]",
		Short: "Run the profile's command, or CMD, in a sandbox of the current directory (the default)",
		Long: `Run the profile's command, or CMD, in a sandbox: the current directory is mounted at
/workspace and is the working directory; nothing else of the host is visible unless the
profile grants it. The sandbox's exit code becomes this command's. Every container,
network and volume of the sandbox is removed when it ends, however it ends.

With --changeset (or workspace.mode: changeset in the profile), the sandbox writes to
a changeset instead: the workspace stays as it is, and run prints the changeset's id;
review it with diff, then apply or discard it. --resume ID continues one.
PROPIO_SANDBOX_CHANGESET_MODE=overlay|copy|auto chooses how it is made.`,
		RunE:        func(cmd *cobra.Command, args []string) error { return a.run(cmd, args, f) },
		Annotations: map[string]string{launches: "yes"},
	}
	f.register(cmd)
	return cmd
}

// exitCode ends the process with a code and prints nothing more, as when
// the sandbox's command exits non-zero.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// withCode is an error that also sets the exit code.
type withCode struct {
	err  error
	code int
}

func (e withCode) Error() string { return e.err.Error() }
func (e withCode) Unwrap() error { return e.err }

func (a *app) run(cmd *cobra.Command, args []string, f runFlags) error {
	// The engine is reached while the profile is read.
	early := sandbox.ConnectEarly(a.engineWant(), a.streams())
	defer early.Close()
	l, err := a.launch(cmd, args, f)
	if err != nil {
		return err
	}
	l.Early = early
	// The collector, held off from the launcher's start, runs again once
	// the sandbox has started, or the launch has ended.
	defer initgc.Restore()
	l.Started = initgc.Restore
	code, err := l.Run(context.Background())
	return a.launchResult(l, code, err)
}

// launch reads the flags and the profile into the launch they ask for.
func (a *app) launch(cmd *cobra.Command, args []string, f runFlags) (*sandbox.Launch, error) {
	command, err := commandAfterDash(cmd, args)
	if err != nil {
		return nil, err
	}
	if f.resume != "" && !f.changeset {
		return nil, usageError{errors.New("--resume continues a changeset: give --changeset too")}
	}
	e, p, err := loadSelected(a.profile)
	if err != nil {
		return nil, err
	}
	a.warnGrants(e.grants)
	if f.changeset {
		if err := p.ForceChangeset(); err != nil {
			return nil, fmt.Errorf("--changeset: %w", err)
		}
	}
	if err := sandbox.CheckSkips(p, f.skip); err != nil {
		return nil, usageError{err}
	}
	if p.Changeset() {
		if err := sandbox.ChangesetMode(); err != nil {
			return nil, usageError{err}
		}
	}
	return &sandbox.Launch{
		Env: e.sandbox(), Profile: p, Ref: a.profile, Engine: a.engineWant(), Cluster: a.cluster(),
		Command: command, Build: f.build, Skip: f.skip, Resume: f.resume,
		Streams: a.streams(),
		TTY:     isTerminal(a.stdin) && isTerminal(a.stdout),
		Report:  reporter{a.stderr},
		Hint:    func(err error) error { return hintError(err, nil, "") },
	}, nil
}

// launchResult is what a launch's outcome makes of this command: the
// sandbox's exit code, or the launch's error with what to do about it.
func (a *app) launchResult(l *sandbox.Launch, code int, err error) error {
	var over *sandbox.DiskCapError
	var gone *sandbox.EngineGoneError
	switch {
	case errors.As(err, &gone):
		// One line: what went away, and what is left for whom.
		return withCode{gone, ExitEngineGone}
	case errors.As(err, &over):
		return withCode{diskCapped(err, over, l.Profile), code}
	case err != nil && code != 0:
		return withCode{hintError(err, l.Profile, l.Ref), code}
	case err != nil:
		return hintError(err, l.Profile, l.Ref)
	case code == notFound || code == notExecutable:
		a.commandHint(l, code)
		return exitCode(code)
	case code != 0:
		return exitCode(code)
	}
	return nil
}

// The exit codes a shell (and tini, the sandbox's init) gives for a
// command it cannot find, or cannot execute.
const (
	notExecutable = 126
	notFound      = 127
)

// commandHint says what an exit of 127 or 126 most likely means: the
// command is not in the image, or not a program it can run (tini, the
// sandbox's init, names only the exec that failed, and a shell only the
// command).
func (a *app) commandHint(l *sandbox.Launch, code int) {
	command := l.Command
	if len(command) == 0 {
		command = l.Profile.Command
	}
	what := "the sandbox's command"
	if len(command) > 0 {
		what = "`" + command[0] + "`"
	}
	image := l.Profile.Image
	if code == notFound {
		fmt.Fprintf(a.stderr, "%s: hint: exit %d: %s, or a command it ran, was not found in the image %s\n", name, code, what, image)
		fmt.Fprintf(a.stderr, "%s: hint: use an image that has it, or build one FROM %s with it installed (a profile's build section, see README: Profile format)\n", name, image)
		return
	}
	fmt.Fprintf(a.stderr, "%s: hint: exit %d: %s, or a command it ran, could not be executed in the image %s: not executable, or a program for another architecture\n", name, code, what, image)
}

// streams are the launcher's own.
func (a *app) streams() sandbox.Streams {
	return sandbox.Streams{In: a.stdin, Out: a.stdout, Err: a.stderr}
}

// withEngine connects to the engine --engine names (else the one auto
// finds), calls fn, and closes the connection.
func (a *app) withEngine(fn func(context.Context, *sandbox.Conn) error) error {
	return a.withEngineOf("", fn)
}

// withEngineOf is withEngine for a profile that names an engine (--engine
// still wins).
func (a *app) withEngineOf(want string, fn func(context.Context, *sandbox.Conn) error) error {
	err := sandbox.With(cmp.Or(a.engineWant(), want), a.streams(), fn)
	return hintError(err, nil, "")
}

func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	return ok && term.IsTerminal(f.Fd())
}
