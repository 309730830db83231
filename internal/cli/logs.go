package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/spf13/cobra"
)

func newLogs(a *app) *cobra.Command {
	var denied, asJSON bool
	cmd := &cobra.Command{
		Use:   "logs [--denied] [--json] [PROJECT]",
		Short: "Show the egress gateway's decisions for the latest allowlist sandbox of this directory",
		Long: `Show what the egress gateway of an allowlist sandbox (network.mode allowlist, as in
the strict and standard profiles) allowed and denied: time, client, way in (http,
connect, socks5, dns, sni, host, tcp), host, port, the rule that decided, and bytes
each way. Without PROJECT, the latest sandbox started in this directory; the log
grows while it runs, so this works during a run as well as after it.`,
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
			if denied {
				entries = onlyDenied(entries)
			}
			if asJSON {
				return printLogJSON(a.stdout, entries)
			}
			return printLogTable(a.stdout, entries)
		},
	}
	cmd.Flags().BoolVar(&denied, "denied", false, "show only denied connections and queries")
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

func onlyDenied(entries []decisionlog.Entry) []decisionlog.Entry {
	var out []decisionlog.Entry
	for _, en := range entries {
		if !en.Allowed {
			out = append(out, en)
		}
	}
	return out
}

func printLogJSON(w io.Writer, entries []decisionlog.Entry) error {
	enc := json.NewEncoder(w)
	for _, en := range entries {
		if err := enc.Encode(en); err != nil {
			return err
		}
	}
	return nil
}

func printLogTable(w io.Writer, entries []decisionlog.Entry) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tDECISION\tVIA\tDESTINATION\tCLIENT\tWHY\tUP\tDOWN")
	for _, en := range entries {
		decision := "denied"
		if en.Allowed {
			decision = "allowed"
		}
		why := en.Reason
		if en.Error != "" {
			why += " (" + en.Error + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s:%d\t%s\t%s\t%d\t%d\n", en.Time.Local().Format("15:04:05.000"), decision, en.Via, en.Host, en.Port, en.Client, why, en.BytesUp, en.BytesDown)
	}
	return tw.Flush()
}
