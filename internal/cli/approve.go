package cli

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/moby/term"
	"github.com/propio/propio-sandbox/internal/approver"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/spf13/cobra"
)

func newApprove(a *app) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "approve [--all]",
		Short: "Decide the permission requests of this directory's sandboxes, live, in a terminal",
		Long: `Attach to the running sandboxes of this directory that can ask (network.unlisted: ask)
as their approver, and decide what they ask for, live, in this terminal (run it in a
second terminal: the agent has the first). The pending requests are listed, the
selected one marked with >:

  a  allow once (this connection)    d  deny once
  r  allow for the rest of the run   x  deny for the rest of the run
  A  allow always (saved in your grants for this workspace)
  D  deny always
  up/down or k/j  select            q or Ctrl-C  quit

Below them, the requests decided lately: by you, or by the gateway (timeout). While
approve runs, asking connections are held until a decision; without an approver
they are denied at once. --all serves every sandbox of yours that can ask. It needs
a terminal: in a script, use requests, allow and deny.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return a.approve(all) },
	}
	cmd.Flags().BoolVar(&all, "all", false, "serve all your sandboxes that can ask, not only this directory's")
	return cmd
}

func (a *app) approve(all bool) error {
	in, _ := a.stdin.(*os.File)
	out, _ := a.stdout.(*os.File)
	if !isTerminal(a.stdin) || !isTerminal(a.stdout) {
		return withHint(errors.New("approve needs a terminal"),
			"list the pending requests with `"+name+" requests` (--watch to follow them), and decide one with `"+name+" allow ID` or `"+name+" deny ID`",
			"or open the web page with `"+name+" ui`")
	}
	e, err := loadEnv()
	if err != nil {
		return err
	}
	reg := register(e, all, a.stderr) // before the terminal is the UI's
	state, err := term.MakeRaw(in.Fd())
	if err != nil {
		if reg != nil {
			reg.Close()
		}
		return err
	}
	defer term.RestoreTerminal(in.Fd(), state)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	board := newBoard(e, all, "approve")
	defer runBoard(ctx, board, reg)()
	size := func() (int, int) {
		if ws, err := term.GetWinsize(out.Fd()); err == nil {
			return int(ws.Width), int(ws.Height)
		}
		return 80, 24
	}
	resized := make(chan os.Signal, 1)
	signal.Notify(resized, syscall.SIGWINCH)
	defer signal.Stop(resized)
	return approver.Terminal(ctx, board, in, out, size, resized)
}

// newBoard is the board of the sandboxes of e's workspace that can ask, or
// of all the user's.
func newBoard(e env, all bool, by string) *approver.Board {
	find := func() ([]approver.Target, error) {
		sbs, err := approver.Find(e.workspace, all)
		return approver.Targets(sbs), err
	}
	return approver.NewBoard(find, grantAlways(e, by), rescan(time.Second))
}

// grantAlways saves an "always" decision of the frontend by in the user's
// grants.
func grantAlways(e env, by string) approver.Granter {
	return func(workspace, host string, port int, action string) error {
		return saveGrant(e.dirs, workspace, host, port, action, by)
	}
}

// runBoard runs board until the function it returns is called, which waits
// for it to end; with reg (which may be nil), the sandboxes announced to
// it are served from their first instant, and it is closed at the end.
func runBoard(ctx context.Context, board *approver.Board, reg *ask.Registration) func() {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); board.Run(ctx) }()
	if reg != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reg.Serve(ctx, func(ctx context.Context, s ask.Sandbox) {
				board.Serve(ctx, approver.Targets([]ask.Sandbox{s})[0])
			})
		}()
	}
	return func() {
		cancel()
		if reg != nil {
			reg.Close()
		}
		wg.Wait()
	}
}
