package ask

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
	"slices"
	"strings"
	"time"
)

// Sandbox is a running sandbox that can ask: its project name, the
// workspace it serves, and its ask directory on the host.
type Sandbox struct{ Project, Workspace, Dir string }

// sandboxInfo is sandbox.json.
type sandboxInfo struct {
	Project   string `json:"project"`
	Workspace string `json:"workspace"`
}

// BaseDir is the directory of the user's ask directories, one per sandbox:
// $XDG_RUNTIME_DIR/propio-sandbox/ask (private to the user, emptied at
// logout), else $XDG_STATE_HOME/propio-sandbox/ask (~/.local/state when
// unset).
func BaseDir() (string, error) {
	if rt := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(rt) {
		return filepath.Join(rt, "propio-sandbox", "ask"), nil
	}
	state := os.Getenv("XDG_STATE_HOME")
	if !filepath.IsAbs(state) {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding the ask directory: %w", err)
		}
		state = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(state, "propio-sandbox", "ask"), nil
}

// Find returns the sandboxes of workspace (all of the user's, with all)
// whose gateway serves its ask socket now, sorted by project. A directory
// whose gateway is gone (a killed launcher's) is passed over.
func Find(workspace string, all bool) ([]Sandbox, error) {
	base, err := BaseDir()
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the sandboxes that ask: %w", err)
	}
	var found []Sandbox
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		s, err := Open(filepath.Join(base, e.Name()))
		if err != nil || !all && s.Workspace != workspace || !s.live() {
			continue
		}
		found = append(found, s)
	}
	slices.SortFunc(found, func(a, b Sandbox) int { return strings.Compare(a.Project, b.Project) })
	return found, nil
}

// Open reads the sandbox an ask directory belongs to.
func Open(dir string) (Sandbox, error) {
	b, err := os.ReadFile(filepath.Join(dir, SandboxFile))
	if err != nil {
		return Sandbox{}, err
	}
	var info sandboxInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return Sandbox{}, fmt.Errorf("reading %s: %w", filepath.Join(dir, SandboxFile), err)
	}
	return Sandbox{Project: info.Project, Workspace: info.Workspace, Dir: dir}, nil
}

// live reports whether something serves the sandbox's socket.
func (s Sandbox) live() bool {
	c, err := net.DialTimeout("unix", filepath.Join(s.Dir, SocketName), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// client speaks HTTP to the sandbox's socket.
func (s Sandbox) client() *http.Client {
	sock := filepath.Join(s.Dir, SocketName)
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}}
}

func (s Sandbox) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://ask"+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking the gateway of %s: %w", s.Project, err)
	}
	return resp, nil
}

// Pending returns the sandbox's pending requests, oldest first.
func (s Sandbox) Pending(ctx context.Context) ([]Request, error) {
	resp, err := s.do(ctx, http.MethodGet, "/v1/requests", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := statusError(s, resp); err != nil {
		return nil, err
	}
	var reqs []Request
	if err := json.NewDecoder(resp.Body).Decode(&reqs); err != nil {
		return nil, fmt.Errorf("reading the requests of %s: %w", s.Project, err)
	}
	return reqs, nil
}

// Watch attaches as an approver while it runs: fn gets every pending
// request first, then each new request and each decision, until ctx ends
// (Watch returns nil then) or the gateway goes away (an error).
func (s Sandbox) Watch(ctx context.Context, fn func(Event)) error {
	return s.WatchAttached(ctx, nil, fn)
}

// WatchAttached is Watch that calls attached (when not nil) once the
// gateway counts it as an approver, before any event.
func (s Sandbox) WatchAttached(ctx context.Context, attached func(), fn func(Event)) error {
	resp, err := s.do(ctx, http.MethodGet, "/v1/watch", nil)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer resp.Body.Close()
	if err := statusError(s, resp); err != nil {
		return err
	}
	if attached != nil {
		attached()
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("reading the requests of %s: %w", s.Project, err)
		}
		fn(ev)
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("watching the requests of %s: %w", s.Project, err)
	}
	return fmt.Errorf("watching the requests of %s: the gateway went away", s.Project)
}

// Decide answers the pending request id; ErrGone when it is no longer
// pending.
func (s Sandbox) Decide(ctx context.Context, id string, d Decision) error {
	if err := d.Validate(); err != nil {
		return err
	}
	b, _ := json.Marshal(d)
	resp, err := s.do(ctx, http.MethodPost, "/v1/requests/"+id, bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("request %s: %w", id, ErrGone)
	}
	return statusError(s, resp)
}

func statusError(s Sandbox, resp *http.Response) error {
	if resp.StatusCode/100 == 2 {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return fmt.Errorf("the gateway of %s: %s: %s", s.Project, resp.Status, strings.TrimSpace(string(msg)))
}

// Make creates the ask directory of project under base (mode 0700, the
// user's) with its sandbox.json, and returns it. A directory left there by
// an earlier sandbox of the name is replaced.
func Make(base, project, workspace string) (string, error) {
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", fmt.Errorf("making the ask directory: %w", err)
	}
	dir := filepath.Join(base, project)
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("making the ask directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("making the ask directory: %w", err)
	}
	b, _ := json.Marshal(sandboxInfo{Project: project, Workspace: workspace})
	if err := os.WriteFile(filepath.Join(dir, SandboxFile), append(b, '\n'), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("making the ask directory: %w", err)
	}
	return dir, nil
}
