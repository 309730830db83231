package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/grants"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

func newAllow(a *app) *cobra.Command { return newDecide(a, ask.Allow) }
func newDeny(a *app) *cobra.Command  { return newDecide(a, ask.Deny) }

// newDecide makes allow or deny (action).
func newDecide(a *app, action string) *cobra.Command {
	var f askFlags
	var scope string
	cmd := &cobra.Command{
		Use:   action + " ID [--for once|run|always] [--all]",
		Short: strings.ToUpper(action[:1]) + action[1:] + " a pending permission request of this directory's sandboxes",
		Long: strings.ToUpper(action[:1]) + action[1:] + ` the pending request ID (as propio-sandbox requests lists it; PROJECT:ID
when two sandboxes have one of that ID). The held connection proceeds, or is
refused, at once. --for once (the default) decides this request alone; run, every
request for the same host and port until the sandbox ends; always, that and every
later run of this workspace, saved in your grants (outside the workspace).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ask.ValidScope(scope); err != nil {
				return usageError{fmt.Errorf("--for: %w", err)}
			}
			s, req, err := findRequest(cmd, f, args[0])
			if err != nil {
				return err
			}
			if scope == ask.ScopeAlways && !ask.Grantable(req) {
				return withHint(ask.ErrNotGrantable, "decide it --for once (the default)")
			}
			if scope == ask.ScopeAlways {
				dirs, err := hostinfo.UserDirs()
				if err != nil {
					return err
				}
				if err := saveGrant(dirs, req.Workspace, req.Host, req.Port, action, action+" --for always"); err != nil {
					return err
				}
			}
			err = s.Decide(cmd.Context(), req.ID, ask.Decision{Action: action, Scope: scope})
			if errors.Is(err, ask.ErrGone) {
				return withHint(err, "it was decided already, timed out, or its connection ended: propio-sandbox logs shows which")
			}
			if err == nil {
				fmt.Fprintf(a.stdout, "%s %s %s (%s)\n", past(action), req.Project, termsafe.Inert(destination(req)), scope)
			}
			return err
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&scope, "for", ask.ScopeOnce, "how far the decision reaches: `once`, run or always")
	return cmd
}

func past(action string) string {
	if action == ask.Allow {
		return "allowed"
	}
	return "denied"
}

// findRequest finds the pending request id (or PROJECT:ID) among the
// sandboxes f serves.
func findRequest(cmd *cobra.Command, f askFlags, id string) (ask.Sandbox, ask.Request, error) {
	project, id, scoped := strings.Cut(id, ":")
	if !scoped {
		project, id = "", project
	}
	sbs, err := f.sandboxes()
	if err != nil {
		return ask.Sandbox{}, ask.Request{}, err
	}
	var found []ask.Request
	var in []ask.Sandbox
	for _, s := range sbs {
		if project != "" && s.Project != project {
			continue
		}
		reqs, err := s.Pending(cmd.Context())
		if err != nil {
			return ask.Sandbox{}, ask.Request{}, err
		}
		for _, r := range reqs {
			if r.ID == id {
				found, in = append(found, r), append(in, s)
			}
		}
	}
	switch {
	case len(sbs) == 0:
		return ask.Sandbox{}, ask.Request{}, withHint(errors.New("no running sandbox of this directory asks"),
			"requests come from sandboxes with network.unlisted: ask or agent_requests; --all serves every sandbox of yours")
	case len(found) == 0:
		return ask.Sandbox{}, ask.Request{}, withHint(fmt.Errorf("request %s: %w", id, ask.ErrGone), "propio-sandbox requests lists the pending ones")
	case len(found) > 1:
		return ask.Sandbox{}, ask.Request{}, withHint(fmt.Errorf("request %s: %d sandboxes have one of that ID", id, len(found)),
			"name it as PROJECT:ID, as in "+in[0].Project+":"+id)
	}
	return in[0], found[0], nil
}

// saveGrant saves an always decision in the user's grants (by says how it
// was made) before the gateway is told, so that later runs of the workspace
// decide it by rule. Port 0, a DNS lookup's request, is the name on 80 and
// 443, as a rule without a port.
func saveGrant(dirs hostinfo.Dirs, workspace, host string, port int, action, by string) error {
	if _, err := grants.Put(dirs, workspace, grants.Grant{Action: action, Host: host, Port: port, By: by}); err != nil {
		return withHint(fmt.Errorf("saving the grant for always: %w", err), "decide it --for run, or write the rule in a profile of yours")
	}
	return nil
}
