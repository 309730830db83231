package cli

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"syscall"

	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

// ExitExec is exec's exit code when the command could not be run in the
// sandbox (none is up, it is stopped or gone, the engine did not answer),
// as docker run's own errors are 125: apart from the command's own codes.
const ExitExec = 125

func newExec(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "exec [NAME] -- CMD...",
		Short: "Run a command in a persistent sandbox (up): this directory's, or NAME",
		Long: `Run CMD in a persistent sandbox that up started: the directory's own, or the one
named NAME. It runs as the sandbox's user, in its working directory, with its
environment, as docker exec does; a terminal when stdin and stdout are terminals,
pipes otherwise. Its exit code is this command's; SIGINT, SIGTERM and SIGHUP go to
the command. Exit 125 when the command could not be run at all.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return a.exec(cmd, args) },
	}
}

func (a *app) exec(cmd *cobra.Command, args []string) error {
	dash := cmd.ArgsLenAtDash()
	if dash < 0 {
		return usageError{errors.New("put the command after --, as in `" + name + " exec [NAME] -- CMD...`")}
	}
	if dash > 1 {
		return usageError{errors.New("one sandbox NAME at most before --")}
	}
	if len(args) == dash {
		return usageError{errors.New("no command after --")}
	}
	dirs, err := hostinfo.UserDirs()
	if err != nil {
		return err
	}
	ws, err := hostinfo.Workspace()
	if err != nil {
		return err
	}
	code, err := sandbox.Exec(context.Background(), sandbox.ExecRequest{
		Dirs: dirs, Name: sandboxName(args[:dash]), Workspace: ws,
		Command: args[dash:], TTY: isTerminal(a.stdin) && isTerminal(a.stdout),
		Streams: a.streams(), Report: reporter{a.stderr},
	})
	var guarded *sandbox.GuardError
	switch {
	case errors.As(err, &guarded):
		// The command ran; what it left could not all be judged.
		return withCode{persistHint(err), cmp.Or(code, 1)}
	case err != nil:
		return withCode{persistHint(err), ExitExec}
	}
	if code != 0 {
		return exitCode(code)
	}
	return nil
}

// sandboxName is the NAME argument, or "" for the directory's sandbox.
func sandboxName(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

// persistHint adds what to do about a persistent sandbox that cannot be
// used.
func persistHint(err error) error {
	var (
		none    *sandbox.NoSandboxError
		several *sandbox.SeveralError
		down    *sandbox.NotRunningError
		dyn     *sandbox.DynamicError
	)
	switch {
	case errors.As(err, &none) && none.Name != "":
		return withHint(err, "`"+name+" ls` lists the sandboxes there are")
	case errors.As(err, &none):
		return withHint(err, "start one with `"+name+" up`, or name one (`"+name+" ls` lists them)")
	case errors.As(err, &several):
		return withHint(err, "give its name: `"+name+" exec NAME -- CMD` (`"+name+" ls` lists them)")
	case errors.As(err, &down) && down.State == sandbox.StateStopped:
		return withHint(err, "start it again with `"+name+" start "+down.Name+"`")
	case errors.As(err, &down) && down.State == "unsupervised":
		return withHint(err, "`"+name+" start "+down.Name+"` gives it a supervisor again, `"+name+" down "+down.Name+"` removes it")
	case errors.As(err, &down) && down.State == sandbox.StateGone:
		return withHint(err, "`"+name+" down "+down.Name+"` forgets it; `"+name+" up` starts a new one")
	case errors.As(err, &down):
		return withHint(err, "`"+name+" ls` shows how it is; `"+name+" down "+down.Name+"` removes it")
	case errors.As(err, &dyn):
		return withHint(err, "use a static build: bin/propio-sandbox builds one, or `CGO_ENABLED=0 go install ./cmd/propio-sandbox`")
	}
	return hintError(err, nil, "")
}

// newKeeper is a persistent sandbox's main process, in the sandbox
// (generator.KeeperCommand): it waits for a signal; `keeper signal SIG ID`
// sends a signal to the command of exec ID.
func newKeeper(a *app) *cobra.Command {
	return &cobra.Command{
		Use:    "keeper [signal SIG ID]",
		Short:  "A persistent sandbox's main process (in the sandbox)",
		Hidden: true,
		Args:   cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 3 && args[0] == "signal" {
				sig, err := strconv.Atoi(args[1])
				if err != nil {
					return usageError{err}
				}
				return sandbox.SignalExec(syscall.Signal(sig), args[2])
			}
			sandbox.Keeper()
			return nil
		},
	}
}
