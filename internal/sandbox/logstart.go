package sandbox

// TEMPORARY: the decision-log store moves into its own package (issue 15,
// branch i15-log); this copy goes when it lands.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/generator"
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
