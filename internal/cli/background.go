package cli

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/spf13/cobra"
)

// backgroundBudget bounds a background process's work.
const backgroundBudget = 5 * time.Minute

// newBackground is the hidden command a launcher's background processes run
// as (started by the launch, never by hand): their output goes to the
// background log.
func newBackground(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:    sandbox.BackgroundArg,
		Short:  "A launcher's background work (started by run, never by hand)",
		Hidden: true,
		Args:   cobra.NoArgs,
	}
	cmd.AddCommand(newBackgroundRemove(a), newBackgroundKeep(a), newBackgroundWatch(a))
	return cmd
}

func newBackgroundKeep(a *app) *cobra.Command {
	var k sandbox.GatewayKeeper
	cmd := &cobra.Command{
		Use:  "keep --spec FILE",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k.Streams = sandbox.Streams{Out: a.stderr, Err: a.stderr}
			// It keeps its gateway for as long as it is told: its own
			// steps are bounded.
			if err := k.Run(context.Background()); err != nil {
				return exitCode(ExitFailure) // said in the log
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&k.Spec, "spec", "", "the file that says what to prepare")
	return cmd
}

func newBackgroundRemove(a *app) *cobra.Command {
	var r sandbox.Removal
	cmd := &cobra.Command{
		Use:  "remove --host HOST --project NAME --launcher PID",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return removeNow(a, r) },
	}
	removalFlags(cmd, &r)
	return cmd
}

// newBackgroundWatch is a run's watchdog: it waits as long as the run
// lasts, and removes the sandbox if its launcher is gone without saying it
// is done.
func newBackgroundWatch(a *app) *cobra.Command {
	var w sandbox.Watchdog
	cmd := &cobra.Command{
		Use:  "watch --host HOST --project NAME --launcher PID",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !w.LauncherGone() {
				return nil
			}
			stamp(a, "the launcher (%d) of sandbox %s is gone: removing the sandbox", w.Launcher, w.Project)
			return removeNow(a, w.Removal)
		},
	}
	removalFlags(cmd, &w.Removal)
	return cmd
}

// removalFlags are the flags that say what a removal removes.
func removalFlags(cmd *cobra.Command, r *sandbox.Removal) {
	cmd.Flags().StringVar(&r.Host, "host", "", "the engine's address")
	cmd.Flags().StringVar(&r.Project, "project", "", "the sandbox's name")
	cmd.Flags().IntVar(&r.Launcher, "launcher", 0, "the pid of the launcher that made it")
}

// removeNow removes what r says, within backgroundBudget, and says how it
// went in the background log.
func removeNow(a *app, r sandbox.Removal) error {
	ctx, cancel := context.WithTimeout(context.Background(), backgroundBudget)
	defer cancel()
	r.Streams = sandbox.Streams{Out: a.stderr, Err: a.stderr}
	if err := r.Run(ctx); err != nil {
		stamp(a, "removing sandbox %s (launcher %d): %v", r.Project, r.Launcher, err)
		return exitCode(ExitFailure)
	}
	stamp(a, "removed sandbox %s (launcher %d)", r.Project, r.Launcher)
	return nil
}

// stamp writes a line to the background log, with the time and pid.
func stamp(a *app, format string, args ...any) {
	fmt.Fprintf(a.stderr, "%s [%d] %s\n", time.Now().Format(time.RFC3339Nano), os.Getpid(), fmt.Sprintf(format, args...))
}
