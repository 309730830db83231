package approver

// REPLACE AT MERGE: this file stands in for package internal/ask (helper A's,
// on branch i17-ask), which this branch does not have yet. It declares the
// ask protocol's types with the same JSON, and a minimal client of the
// protocol as the coordination fixes it (HTTP on the unix socket ask.sock of
// each sandbox's ask directory), so that approve and ui run end to end
// against a gateway, or the fake the e2e tests start. At merge, replace it
// with aliases of internal/ask's:
//
//	type (Request = ask.Request; Decision = ask.Decision; Event = ask.Event; Sandbox = ask.Sandbox)
//	var (Find = ask.Find; ErrGone = ask.ErrGone)
//
// Nothing else in this package knows the transport: the frontends use the
// Asker interface below, which ask.Sandbox satisfies.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Request is a pending permission request of a sandbox.
type Request struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	Host      string    `json:"host"`
	Port      int       `json:"port"`
	Via       string    `json:"via"`
	Project   string    `json:"project"`
	Workspace string    `json:"workspace"`
	Reason    string    `json:"reason"`
	Created   time.Time `json:"created"`
}

// Decision answers a request.
type Decision struct {
	Action string `json:"action"` // "allow" | "deny"
	Scope  string `json:"scope"`  // "once" | "run" | "always"
}

// Event is one line of the watch stream.
type Event struct {
	Type      string    `json:"type"` // "pending" | "decided"
	Request   Request   `json:"request"`
	Decision  *Decision `json:"decision,omitempty"`
	DecidedBy string    `json:"decided_by,omitempty"` // user | timeout | no-approver
}

// Sandbox is a running sandbox that can ask.
type Sandbox struct{ Project, Workspace, Dir string }

// ErrGone: the request is no longer pending.
var ErrGone = errors.New("the request is no longer pending")

// askDir is where the sandboxes' ask directories are.
func askDir() (string, error) {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "propio-sandbox", "ask"), nil
	}
	state := os.Getenv("XDG_STATE_HOME")
	if state == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding home directory: %w", err)
		}
		state = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(state, "propio-sandbox", "ask"), nil
}

// Find returns the askable sandboxes of workspace, or all of the user's.
func Find(workspace string, all bool) ([]Sandbox, error) {
	base, err := askDir()
	if err != nil {
		return nil, err
	}
	dirs, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the ask directory: %w", err)
	}
	var out []Sandbox
	for _, d := range dirs {
		dir := filepath.Join(base, d.Name())
		data, err := os.ReadFile(filepath.Join(dir, "sandbox.json"))
		if err != nil {
			continue
		}
		var sj struct{ Project, Workspace string }
		if json.Unmarshal(data, &sj) != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "ask.sock")); err != nil {
			continue
		}
		if all || sj.Workspace == workspace {
			out = append(out, Sandbox{Project: sj.Project, Workspace: sj.Workspace, Dir: dir})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Project < out[j].Project })
	return out, nil
}

func (s Sandbox) client() *http.Client {
	sock := filepath.Join(s.Dir, "ask.sock")
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

func (s Sandbox) do(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://ask"+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking sandbox %s: %w", s.Project, err)
	}
	return resp, nil
}

func statusError(s Sandbox, resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Errorf("sandbox %s: %s: %s", s.Project, resp.Status, strings.TrimSpace(string(msg)))
}

// Pending returns the sandbox's pending requests.
func (s Sandbox) Pending(ctx context.Context) ([]Request, error) {
	resp, err := s.do(ctx, http.MethodGet, "/v1/requests", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(s, resp)
	}
	var out []Request
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("sandbox %s: reading its requests: %w", s.Project, err)
	}
	return out, nil
}

// Watch calls fn with every event of the sandbox, the pending requests
// first, until ctx ends or the sandbox does.
func (s Sandbox) Watch(ctx context.Context, fn func(Event)) error {
	resp, err := s.do(ctx, http.MethodGet, "/v1/watch", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return statusError(s, resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("sandbox %s: reading its events: %w", s.Project, err)
		}
		fn(e)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return sc.Err()
}

// Decide answers the request id; ErrGone when it is no longer pending.
func (s Sandbox) Decide(ctx context.Context, id string, d Decision) error {
	body, err := json.Marshal(d)
	if err != nil {
		return err
	}
	resp, err := s.do(ctx, http.MethodPost, "/v1/requests/"+id, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("request %s of sandbox %s: %w", id, s.Project, ErrGone)
	case resp.StatusCode/100 != 2:
		return statusError(s, resp)
	}
	return nil
}
