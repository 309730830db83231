package cli

import (
	"context"
	"fmt"

	"github.com/propio/propio-sandbox/internal/daemon"
	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

// superviseFlags are the supervisor's: up's, which sandbox of the name it
// is and where it logs, or the sandbox start resumes.
type superviseFlags struct {
	upFlags
	id, log string
	start   string
}

// newSupervise is a persistent sandbox's supervisor, which up and start
// start in the background (internal/daemon): it makes the sandbox (or
// starts it again), says when it runs, and holds it until it ends.
func newSupervise(a *app) *cobra.Command {
	var f superviseFlags
	cmd := &cobra.Command{
		Use:    "supervise",
		Short:  "A persistent sandbox's supervisor (up and start run it in the background)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   func(cmd *cobra.Command, _ []string) error { return a.supervise(cmd, f) },
	}
	f.register(cmd)
	cmd.Flags().StringVar(&f.id, "id", "", "the sandbox's id")
	cmd.Flags().StringVar(&f.log, "log", "", "the supervisor's log")
	cmd.Flags().StringVar(&f.start, "start", "", "start the stopped sandbox `NAME` again")
	return cmd
}

func (a *app) supervise(cmd *cobra.Command, f superviseFlags) error {
	// Until the sandbox runs, what the supervisor says is up's (or
	// start's) to show; then only its log's.
	a.stderr = daemon.Tee(a.stderr)
	l, err := a.supervisorLaunch(cmd, f)
	if err != nil {
		return a.notUp(err)
	}
	l.Keep.Ready = daemon.Ready
	code, err := sandbox.Supervise(context.Background(), l)
	if !l.Keep.WasReady() {
		if err == nil {
			err = fmt.Errorf("the sandbox ended before it ran (exit %d)", code)
		}
		return a.notUp(a.launchResult(l, code, err))
	}
	if err != nil {
		report(a.stderr, hintError(err, l.Profile, l.Ref))
	}
	return nil
}

// supervisorLaunch is the launch the supervisor runs: up's, or the one
// that starts the stopped sandbox again.
func (a *app) supervisorLaunch(cmd *cobra.Command, f superviseFlags) (*sandbox.Launch, error) {
	if f.start == "" {
		l, err := a.launch(cmd, nil, f.runFlags)
		if err != nil {
			return nil, err
		}
		l.TTY = false
		l.Keep = &sandbox.Keep{Name: f.name, ID: f.id, Log: f.log}
		return l, nil
	}
	e, err := loadEnv()
	if err != nil {
		return nil, err
	}
	rec, err := sandbox.Find(e.dirs, f.start, "")
	if err != nil {
		return nil, err
	}
	p, err := e.loadProfile(rec.Ref)
	if err != nil {
		return nil, err
	}
	return &sandbox.Launch{
		Env: e.sandbox(), Profile: p, Ref: rec.Ref, Engine: a.engineWant(),
		Streams: a.streams(), Report: reporter{a.stderr},
		Hint: func(err error) error { return hintError(err, nil, "") },
		Keep: &sandbox.Keep{Record: &rec, Log: rec.Log},
	}, nil
}

// notUp says, to up (or start) and the log, why the sandbox is not up,
// and tells up with which exit code.
func (a *app) notUp(err error) error {
	code := report(a.stderr, err)
	daemon.Fail(code, err)
	return exitCode(code)
}
