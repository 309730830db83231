package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/gateway"
	"github.com/spf13/cobra"
)

// logHeader is the first line of a gateway log, written by the launcher
// before the sandbox starts: it ties the log to its workspace.
type logHeader struct {
	Time      time.Time `json:"time"`
	Event     string    `json:"event"` // "start"
	Project   string    `json:"project"`
	Workspace string    `json:"workspace"`
	Profile   string    `json:"profile"`
}

// startLog creates the decision log of a sandbox, owned by the user and
// readable by no one else, with its header line; the gateway appends to it.
func startLog(dir string, h logHeader) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating the log directory: %w", err)
	}
	path := filepath.Join(dir, generator.LogFile(h.Project))
	line, err := json.Marshal(h)
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("creating the gateway log: %w", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		os.Remove(path)
		return "", fmt.Errorf("writing the gateway log: %w", err)
	}
	pruneLogs(dir, keepLogs)
	return path, f.Close()
}

// keepLogs is how many gateway logs the log directory keeps.
const keepLogs = 200

// pruneLogs removes all but the keep most recently written logs of dir. A
// log that cannot be removed stays; nothing else in dir is touched.
func pruneLogs(dir string, keep int) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type log struct {
		path string
		mod  time.Time
	}
	var logs []log
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".jsonl") {
			continue
		}
		if info, err := e.Info(); err == nil {
			logs = append(logs, log{filepath.Join(dir, e.Name()), info.ModTime()})
		}
	}
	if len(logs) <= keep {
		return
	}
	sort.Slice(logs, func(i, j int) bool { return logs[i].mod.After(logs[j].mod) })
	for _, l := range logs[keep:] {
		os.Remove(l.path)
	}
}

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
			e, err := loadEnv()
			if err != nil {
				return err
			}
			dir := e.dirs.LogDir()
			var path string
			if len(args) == 1 {
				path = filepath.Join(dir, generator.LogFile(args[0]))
				if _, err := os.Stat(path); err != nil {
					return withHint(fmt.Errorf("no gateway log for sandbox %s in %s", args[0], dir), "list the logs with `ls "+dir+"`")
				}
			} else if path, err = latestLog(dir, e.workspace); err != nil {
				return err
			}
			entries, err := readLog(path)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(a.stdout)
				for _, en := range entries {
					if !denied || !en.Allowed {
						if err := enc.Encode(en); err != nil {
							return err
						}
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tDECISION\tVIA\tDESTINATION\tCLIENT\tWHY\tUP\tDOWN")
			for _, en := range entries {
				if denied && en.Allowed {
					continue
				}
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
		},
	}
	cmd.Flags().BoolVar(&denied, "denied", false, "show only denied connections and queries")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the decisions as JSON lines")
	return cmd
}

// latestLog finds the newest gateway log whose sandbox ran in workspace.
func latestLog(dir, workspace string) (string, error) {
	noLog := withHint(fmt.Errorf("no gateway log for %s", workspace),
		"gateway logs are written by sandboxes with network.mode allowlist (such as -p strict or -p standard, the default)")
	files, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", noLog
	}
	if err != nil {
		return "", fmt.Errorf("reading the log directory: %w", err)
	}
	type found struct {
		path string
		at   time.Time
	}
	var logs []found
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".jsonl") {
			continue
		}
		path := filepath.Join(dir, f.Name())
		h, err := readHeader(path)
		if err != nil || h.Workspace != workspace {
			continue
		}
		logs = append(logs, found{path, h.Time})
	}
	if len(logs) == 0 {
		return "", noLog
	}
	sort.Slice(logs, func(i, j int) bool { return logs[i].at.After(logs[j].at) })
	return logs[0].path, nil
}

func readHeader(path string) (logHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return logHeader{}, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadBytes('\n')
	if err != nil {
		return logHeader{}, err
	}
	var h logHeader
	if err := json.Unmarshal(line, &h); err != nil || h.Event != "start" {
		return logHeader{}, fmt.Errorf("%s: not a gateway log", path)
	}
	return h, nil
}

// readLog returns a log's decisions. A line being written as the log is read
// (the sandbox still runs) is left for the next time.
func readLog(path string) ([]gateway.Entry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the gateway log: %w", err)
	}
	var out []gateway.Entry
	for i, line := range strings.SplitAfter(string(data), "\n") {
		if i == 0 || !strings.HasSuffix(line, "\n") || strings.TrimSpace(line) == "" {
			continue // the header, or a partial last line
		}
		var e gateway.Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		out = append(out, e)
	}
	return out, nil
}
