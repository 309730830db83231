package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

// askFlags choose the sandboxes a request command serves: those of this
// workspace, or with --all all of the user's.
type askFlags struct{ all bool }

func (f *askFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.all, "all", false, "serve every running sandbox of yours, not only this directory's")
}

// sandboxes finds the sandboxes that can ask, of this workspace or all.
func (f askFlags) sandboxes() ([]ask.Sandbox, error) {
	e, err := loadEnv()
	if err != nil {
		return nil, err
	}
	return ask.Find(e.workspace, f.all)
}

func newRequests(a *app) *cobra.Command {
	var f askFlags
	var asJSON, watch bool
	cmd := &cobra.Command{
		Use:   "requests [--json] [--watch] [--all]",
		Short: "List the pending permission requests of this directory's sandboxes (network.unlisted: ask, agent_requests)",
		Long: `List what the sandboxes of this directory wait for you to decide: connections that
no rule of a profile with network.unlisted: ask matches, held by the gateway until
you answer with allow ID or deny ID, or until network.ask_timeout; and what the
agent asks for from inside (agent_requests: a port, resources, a host path), with
its reason.

--watch attaches as an approver and prints each request and each decision as it
happens until interrupted: while no approver is attached, a sandbox's requests
are denied at once. --json prints JSON (with --watch, one event per line).
--all serves every running sandbox of yours.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if watch {
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return watchRequests(ctx, a.stdout, a.stderr, f, asJSON)
			}
			return listRequests(cmd.Context(), a.stdout, f, asJSON)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&watch, "watch", false, "attach as an approver and print requests and decisions as they happen")
	return cmd
}

// listRequests prints the pending requests of the sandboxes f serves.
func listRequests(ctx context.Context, w io.Writer, f askFlags, asJSON bool) error {
	sbs, err := f.sandboxes()
	if err != nil {
		return err
	}
	reqs := []ask.Request{}
	for _, s := range sbs {
		rs, err := s.Pending(ctx)
		if err != nil {
			return err
		}
		reqs = append(reqs, rs...)
	}
	if asJSON {
		enc := json.NewEncoder(termsafe.JSON(w))
		enc.SetIndent("", "  ")
		return enc.Encode(reqs)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROJECT\tKIND\tVIA\tDESTINATION\tWAITING\tREASON")
	for _, r := range reqs {
		tableRow(tw, r.ID, r.Project, r.Kind, r.Via, destination(r), time.Since(r.Created).Round(time.Second).String(), r.Reason)
	}
	return tw.Flush()
}

// tableRow writes cells as a row of a tabwriter, each made inert: what a
// sandbox sent can neither act on the terminal nor print a row of its own.
func tableRow(w io.Writer, cells ...string) {
	for i, c := range cells {
		cells[i] = termsafe.Inert(c)
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// destination is host:port (the name alone for a lookup), or what an
// agent's request asks for.
func destination(r ask.Request) string { return r.What() }

// watchRequests attaches to every sandbox f serves, those running and,
// from their first instant, those that start, and prints their events
// until ctx ends. It says once, on status, that it is attached.
func watchRequests(ctx context.Context, w, status io.Writer, f askFlags, asJSON bool) error {
	e, err := loadEnv()
	if err != nil {
		return err
	}
	print := func(ev ask.Event) {
		if asJSON {
			_ = json.NewEncoder(termsafe.JSON(w)).Encode(ev)
			return
		}
		fmt.Fprintln(w, termsafe.Inert(eventLine(ev)))
	}
	ready := func() {
		fmt.Fprintf(status, "%s: approving the requests of %s as they come, from each sandbox's start; Ctrl-C stops\n", name, served(e, f.all))
	}
	reg := register(e, f.all, status)
	if reg != nil {
		defer reg.Close()
	}
	return ask.Follow(ctx, e.workspace, f.all, reg, rescan(500*time.Millisecond), ready, print)
}

// register registers this command as an approver of the sandboxes of e's
// workspace (every one of the user's, with all), so that each sandbox that
// starts is announced to it before it starts. Failing that, it warns: a
// sandbox that starts is found within a second, and what it asks before is
// denied.
func register(e env, all bool, status io.Writer) *ask.Registration {
	reg, err := ask.Register(e.workspace, all)
	if err != nil {
		fmt.Fprintf(status, "%s: warning: %v; a sandbox that starts now is found within a second, and what it asks before that is denied\n", name, err)
		return nil
	}
	return reg
}

// eventLine is an event as watch prints it.
func eventLine(ev ask.Event) string {
	r := ev.Request
	if ev.Type == ask.EventDecided && ev.Decision != nil {
		return fmt.Sprintf("decided %s %s %s %s: %s %s, by %s", r.Project, r.ID, r.Kind, destination(r), ev.Decision.Action, ev.Decision.Scope, ev.DecidedBy)
	}
	return fmt.Sprintf("pending %s %s %s %s via %s: %s (propio-sandbox allow %s, or deny %s)", r.Project, r.ID, r.Kind, destination(r), r.Via, r.Reason, r.ID, r.ID)
}
