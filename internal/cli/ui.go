package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/propio/propio-sandbox/internal/approver"
	"github.com/spf13/cobra"
)

func newUI(a *app) *cobra.Command {
	var all, noOpen bool
	cmd := &cobra.Command{
		Use:   "ui [--all] [--no-open]",
		Short: "Decide the permission requests of this directory's sandboxes on a local web page",
		Long: `Serve a web page on 127.0.0.1, on a random port, with the pending permission requests
of the running sandboxes of this directory that can ask (network.unlisted: ask),
live, one-click decisions (allow once, for the run, always; deny once, for the run,
always), the requests decided lately and each sandbox's decision log. While it
runs it is their approver. It prints the page's address, with a random token in
its path, and opens it in your browser unless --no-open. The page answers only
to that address: a request without the token, for another host name or from
another origin is refused (403). --all serves every sandbox of yours that can
ask. Ctrl-C stops it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return a.ui(all, noOpen) },
	}
	cmd.Flags().BoolVar(&all, "all", false, "serve all your sandboxes that can ask, not only this directory's")
	cmd.Flags().BoolVar(&noOpen, "no-open", false, "print the address only; do not open a browser")
	return cmd
}

func (a *app) ui(all, noOpen bool) error {
	e, err := loadEnv()
	if err != nil {
		return err
	}
	board := newBoard(e, all, "ui")
	web, err := approver.NewWeb(board, e.dirs.LogDir())
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	defer runBoard(ctx, board, register(e, all, a.stderr))()
	fmt.Fprintln(a.stdout, web.URL())
	fmt.Fprintf(a.stderr, "%s: the requests of %s are on the page above, live; Ctrl-C stops it\n", name, served(e, all))
	if !noOpen {
		closeOpen, err := approver.Open(ctx, web.URL(), e.dirs.State)
		if err != nil {
			fmt.Fprintf(a.stderr, "%s: warning: opening a browser: %v; open the address yourself\n", name, err)
		} else {
			defer closeOpen()
		}
	}
	return web.Serve(ctx)
}

// served says whose sandboxes a board serves.
func served(e env, all bool) string {
	if all {
		return "all your sandboxes"
	}
	return "the sandboxes of " + e.workspace
}
