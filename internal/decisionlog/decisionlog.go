// Package decisionlog is the egress gateway's decision log: one JSON-lines
// file per allowlist sandbox, PROJECT.jsonl in the user's log directory. The
// launcher starts it with a Header line that ties it to a workspace, the
// gateway appends one Entry per decision, and `propio-sandbox logs` reads it,
// during the run or after it.
//
// This package owns the format, the file names and the directory's upkeep.
// It knows neither the gateway nor the CLI; it writes nothing but logs, and
// only in the directory it is given.
package decisionlog

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ext ends the name of every log, and only logs, in the log directory.
const ext = ".jsonl"

// Keep is how many logs Start leaves in the log directory.
const Keep = 200

// ErrNoLog is returned when the log looked for does not exist.
var ErrNoLog = errors.New("no gateway log")

// FileName is the name of a sandbox's log in the log directory. It is pure,
// for the generator, which mounts the directory in the gateway's container
// and names the file in its command.
func FileName(project string) string { return project + ext }

// Path is where the log of project is in dir.
func Path(dir, project string) string { return filepath.Join(dir, FileName(project)) }

// Header is the first line of a log, written by the launcher before the
// sandbox starts: it ties the log to its workspace.
type Header struct {
	Time      time.Time `json:"time"`
	Event     string    `json:"event"` // "start"; Start sets it
	Project   string    `json:"project"`
	Workspace string    `json:"workspace"`
	Profile   string    `json:"profile"`
}

// startEvent is the Event of every Header.
const startEvent = "start"

// Entry is one decision of the gateway: a connection or a DNS query, allowed
// or denied, and the bytes it carried.
type Entry struct {
	Time      time.Time `json:"time"`
	Client    string    `json:"client"` // the sandbox-side address
	Via       string    `json:"via"`    // http, connect, socks5, dns, sni, host, tcp, nat
	Host      string    `json:"host"`
	Port      uint16    `json:"port"`
	Allowed   bool      `json:"allowed"`
	Rule      string    `json:"rule,omitempty"` // the rule that decided, as written
	Reason    string    `json:"reason"`
	BytesUp   int64     `json:"bytes_up"`   // sandbox to upstream
	BytesDown int64     `json:"bytes_down"` // upstream to sandbox
	Error     string    `json:"error,omitempty"`
	// DecidedBy is who decided: rule (the profile's rules, or the addresses
	// no rule can allow), user (asked, with network.unlisted: ask, or by a
	// decision of theirs for the run), timeout (asked, and nobody answered
	// in time) or no-approver (asked, and nobody was there to answer, or
	// too many requests waited). Logs written before it was recorded have
	// none: ByWho says rule for them.
	DecidedBy string `json:"decided_by,omitempty"`
	// Scope is how far a user's decision reaches: once, run or always.
	Scope string `json:"scope,omitempty"`
	// Kind is what was asked, for a request the agent made from inside
	// (Via "agent", written by the launcher): port, resources or mount;
	// empty for the gateway's (network). Asked says what was asked for:
	// "memory 4.0GiB, pids 500", "port 3000", a host path.
	Kind  string `json:"kind,omitempty"`
	Asked string `json:"asked,omitempty"`
	// An HTTP request the gateway saw whole (a connection whose TLS it
	// terminated, or plain HTTP): its Method, its Path (never the query),
	// and the Status it was answered with.
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	Status int    `json:"status,omitempty"`
	// Secrets are the variables whose real values the gateway put in the
	// request's headers, in place of their sentinels. Sentinels are those
	// whose sentinels left as the sandbox sent them: to a host the secret
	// does not name, or outside the headers. Masked are those whose real
	// values the response carried, masked before it reached the sandbox.
	// Names only, never a value.
	Secrets   []string `json:"secrets,omitempty"`
	Sentinels []string `json:"sentinels,omitempty"`
	Masked    []string `json:"masked,omitempty"`
}

// Destination is what e was about, as `logs` shows it: host:port (a name
// alone for a DNS query), METHOD host:port/path for an HTTP request the
// gateway saw whole, or, for an agent's request, its kind and what it asked
// for.
func (e Entry) Destination() string {
	switch {
	case e.Kind != "":
		return e.Kind + " " + e.Asked
	case e.Method != "":
		return e.Method + " " + net.JoinHostPort(e.Host, strconv.Itoa(int(e.Port))) + e.Path
	case e.Port != 0:
		return net.JoinHostPort(e.Host, strconv.Itoa(int(e.Port)))
	}
	return e.Host
}

// Brokering says what the gateway did with secrets in e, for `logs`: the
// secrets put in, the sentinels left, the values masked; "" for none.
func (e Entry) Brokering() string {
	var parts []string
	for _, p := range []struct {
		what  string
		names []string
	}{{"put in", e.Secrets}, {"sentinel left", e.Sentinels}, {"masked in the response", e.Masked}} {
		if len(p.names) > 0 {
			parts = append(parts, p.what+": "+strings.Join(p.names, ", "))
		}
	}
	return strings.Join(parts, "; ")
}

// ByWho is who decided e: DecidedBy, or rule for an entry without one (the
// rules decided everything before the gateway could ask).
func (e Entry) ByWho() string {
	if e.DecidedBy == "" {
		return "rule"
	}
	return e.DecidedBy
}

// Outcome is what became of a decision, as `logs` shows it.
type Outcome string

const (
	Allowed Outcome = "allowed" // the rules allowed it and it went through
	Denied  Outcome = "denied"  // the rules, or the addresses no rule can allow, refused it
	// Failed: the rules allowed it, but it did not go through: the name did
	// not resolve, or the upstream did not answer.
	Failed Outcome = "failed"
)

// Outcome is what became of e: Denied when it was not allowed, Failed when
// it was allowed but has an error, else Allowed.
func (e Entry) Outcome() Outcome {
	switch {
	case !e.Allowed:
		return Denied
	case e.Error != "":
		return Failed
	}
	return Allowed
}

// Start creates the log of h.Project in dir, owned by the user and readable
// by no one else, with its header line, and returns its path; the gateway
// appends to it. It then prunes dir to the Keep newest logs. A log of the
// same project already there (an earlier sandbox of that name) is never
// overwritten: it is kept, renamed PROJECT.TIME.jsonl.
func Start(dir string, h Header) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating the log directory: %w", err)
	}
	path := Path(dir, h.Project)
	h.Event = startEvent
	line, err := json.Marshal(h)
	if err != nil {
		return "", err
	}
	// A project's name is reused once its launcher is gone (the caller
	// holds it): an earlier sandbox's log is kept, under a name of its own.
	if _, err := os.Lstat(path); err == nil {
		aside := filepath.Join(dir, h.Project+"."+time.Now().UTC().Format("20060102T150405.000000000")+".jsonl")
		if err := os.Rename(path, aside); err != nil {
			return "", fmt.Errorf("keeping the earlier gateway log of %s: %w", h.Project, err)
		}
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
	Prune(dir, Keep)
	return path, f.Close()
}

// Prepare makes the log of a sandbox made ahead of its run (its gateway
// starts before the run does): an empty file, the user's alone, that the
// gateway appends to and Begin starts; an earlier log of the same project is
// kept aside, as Start does. It returns the log's path. Until Begin, the
// log has no header, and Latest passes it over.
func Prepare(dir, project string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating the log directory: %w", err)
	}
	path := Path(dir, project)
	if _, err := os.Lstat(path); err == nil {
		aside := filepath.Join(dir, project+"."+time.Now().UTC().Format("20060102T150405.000000000")+".jsonl")
		if err := os.Rename(path, aside); err != nil {
			return "", fmt.Errorf("keeping the earlier gateway log of %s: %w", project, err)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("creating the gateway log: %w", err)
	}
	Prune(dir, Keep)
	return path, f.Close()
}

// Begin starts a log Prepare made, once its sandbox's run begins: the
// header, with the run's time, as its first line. The log must still be
// empty (its gateway has decided nothing yet: no sandbox was on its
// network); a log that is not is refused, untouched.
func Begin(dir string, h Header) error {
	h.Event = startEvent
	line, err := json.Marshal(h)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(Path(dir, h.Project), os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("starting the gateway log: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("starting the gateway log: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Size() != 0 {
		return fmt.Errorf("starting the gateway log %s: it is not the empty log made for it", f.Name())
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("starting the gateway log: %w", err)
	}
	return nil
}

// Writer appends entries as JSON lines; it is safe for concurrent use, and
// writes each entry with a single Write, so lines never interleave.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
	c  io.Closer
}

// NewWriter writes entries to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Append opens the log at path to append entries to it, creating it
// (readable by its owner only) when it is not there.
func Append(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the decision log: %w", err)
	}
	return &Writer{w: f, c: f}, nil
}

// Write appends one entry.
func (l *Writer) Write(e Entry) error {
	e.DecidedBy = e.ByWho() // every line says who decided
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.w.Write(append(line, '\n'))
	return err
}

// Close closes the file Append opened; for a NewWriter it does nothing.
func (l *Writer) Close() error {
	if l.c == nil {
		return nil
	}
	return l.c.Close()
}

// Read returns the entries of the log at path, in the order they happened
// (by Time; a connection is written when it ends, with the time it was
// decided). A last line without its newline is one the gateway is writing as
// the log is read (the sandbox still runs): it is left for the next time.
func Read(path string) ([]Entry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the gateway log: %w", err)
	}
	var out []Entry
	for i, line := range strings.SplitAfter(string(data), "\n") {
		if i == 0 || !strings.HasSuffix(line, "\n") || strings.TrimSpace(line) == "" {
			continue // the header, or a partial last line
		}
		var e Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		out = append(out, e)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, nil
}

// Find returns the path of project's log in dir, or ErrNoLog.
func Find(dir, project string) (string, error) {
	path := Path(dir, project)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoLog, err)
	}
	return path, nil
}

// Latest returns the path of the newest log in dir, by its header's time,
// whose sandbox ran in workspace; ErrNoLog when there is none.
func Latest(dir, workspace string) (string, error) {
	files, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", ErrNoLog
	}
	if err != nil {
		return "", fmt.Errorf("reading the log directory: %w", err)
	}
	var best string
	var at time.Time
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ext) {
			continue
		}
		path := filepath.Join(dir, f.Name())
		h, err := readHeader(path)
		if err != nil || h.Workspace != workspace {
			continue
		}
		if best == "" || h.Time.After(at) {
			best, at = path, h.Time
		}
	}
	if best == "" {
		return "", ErrNoLog
	}
	return best, nil
}

// readHeader returns the header of the log at path; an error when its first
// line is not one.
func readHeader(path string) (Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadBytes('\n')
	if err != nil {
		return Header{}, fmt.Errorf("%s: not a gateway log", path)
	}
	var h Header
	if err := json.Unmarshal(line, &h); err != nil || h.Event != startEvent {
		return Header{}, fmt.Errorf("%s: not a gateway log", path)
	}
	return h, nil
}

// Prune removes all but the keep most recently written logs of dir. A log
// that cannot be removed stays; nothing else in dir is touched.
func Prune(dir string, keep int) {
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
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ext) {
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
