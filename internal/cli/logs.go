package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/termsafe"
	"github.com/spf13/cobra"
)

func newLogs(a *app) *cobra.Command {
	var denied, failed, asJSON bool
	cmd := &cobra.Command{
		Use:   "logs [--denied] [--errors] [--json] [PROJECT]",
		Short: "Show the egress gateway's decisions for the latest allowlist sandbox of this directory",
		Long: `Show what the egress gateway of an allowlist sandbox (network.mode allowlist, as in
the strict and standard profiles) allowed, denied, and allowed but could not
carry (failed: a name that does not resolve, an upstream that does not answer),
one line per decision, in the order they happened: time, outcome, who decided
(rule; or, with network.unlisted: ask, user/SCOPE, timeout or no-approver), way
in (http, connect, socks5, dns, nat, sni, host, tcp), destination, client, why,
and bytes each way. Without PROJECT, the latest sandbox started in this directory; the log
grows while it runs, so this works during a run as well as after it (a
connection is listed once it has ended).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := findLog(args)
			if err != nil {
				return err
			}
			entries, err := decisionlog.Read(path)
			if err != nil {
				return err
			}
			entries = onlyOutcomes(entries, denied, failed)
			if asJSON {
				return printLogJSON(a.stdout, entries)
			}
			return printLogTable(a.stdout, entries)
		},
	}
	cmd.Flags().BoolVar(&denied, "denied", false, "show only denied connections and queries (with --errors: and the failures)")
	cmd.Flags().BoolVar(&failed, "errors", false, "show only what was allowed but failed: names that did not resolve, upstreams that did not answer")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the decisions as JSON lines")
	return cmd
}

// findLog is the log of the sandbox named in args, or else of the latest
// sandbox of this workspace.
func findLog(args []string) (string, error) {
	e, err := loadEnv()
	if err != nil {
		return "", err
	}
	dir := e.dirs.LogDir()
	if len(args) == 1 {
		path, err := decisionlog.Find(dir, args[0])
		if errors.Is(err, decisionlog.ErrNoLog) {
			return "", withHint(fmt.Errorf("no gateway log for sandbox %s in %s", args[0], dir), "list the logs with `ls "+dir+"`")
		}
		return path, err
	}
	path, err := decisionlog.Latest(dir, e.workspace)
	if errors.Is(err, decisionlog.ErrNoLog) {
		return "", withHint(fmt.Errorf("no gateway log for %s", e.workspace),
			"gateway logs are written by sandboxes with network.mode allowlist (such as -p strict or -p standard, the default)")
	}
	return path, err
}

// onlyOutcomes keeps the denied entries, the failed ones, or both; all of
// them when neither is asked for.
func onlyOutcomes(entries []decisionlog.Entry, denied, failed bool) []decisionlog.Entry {
	if !denied && !failed {
		return entries
	}
	var out []decisionlog.Entry
	for _, en := range entries {
		switch en.Outcome() {
		case decisionlog.Denied:
			if denied {
				out = append(out, en)
			}
		case decisionlog.Failed:
			if failed {
				out = append(out, en)
			}
		}
	}
	return out
}

func printLogJSON(w io.Writer, entries []decisionlog.Entry) error {
	enc := json.NewEncoder(termsafe.JSON(w))
	for _, en := range entries {
		if err := enc.Encode(en); err != nil {
			return err
		}
	}
	return nil
}

func printLogTable(w io.Writer, entries []decisionlog.Entry) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tDECISION\tBY\tVIA\tDESTINATION\tCLIENT\tWHY\tUP\tDOWN")
	for _, en := range entries {
		why := en.Reason
		if en.Status != 0 {
			why += fmt.Sprintf(" [%d]", en.Status)
		}
		if b := en.Brokering(); b != "" {
			why += " {" + b + "}"
		}
		if en.Error != "" {
			why += " (" + en.Error + ")"
		}
		dest := en.Destination() // host:port, a name (a DNS query), or an agent's request
		by := en.ByWho()
		if en.Scope != "" {
			by += "/" + en.Scope // user/once, user/run, user/always
		}
		// A name a sandbox asked for may hold a newline or a terminal's
		// escape: quoted (printable), it cannot print a row of its own.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", en.Time.Local().Format("15:04:05.000"), en.Outcome(),
			printable(by), printable(en.Via), printable(dest), printable(en.Client), printable(why), en.BytesUp, en.BytesDown)
	}
	return tw.Flush()
}
