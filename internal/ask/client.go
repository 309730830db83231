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
	"sync"
	"time"

	"github.com/propio/propio-sandbox/internal/fsutil"
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

// sockets are the sockets of the sandbox's ask directory (the gateway's
// ask.sock, the launcher's launcher.sock), sorted.
func (s Sandbox) sockets() []string {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".sock") && e.Type()&os.ModeSocket != 0 {
			names = append(names, e.Name())
		}
	}
	return names
}

// exists reports whether the sandbox's ask directory is still there.
func (s Sandbox) exists() bool {
	_, err := os.Stat(filepath.Join(s.Dir, SandboxFile))
	return err == nil
}

// live reports whether something serves one of the sandbox's sockets.
func (s Sandbox) live() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, name := range s.sockets() {
		if c, err := s.dial(ctx, name); err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// dial connects to the sandbox's socket name.
func (s Sandbox) dial(ctx context.Context, name string) (net.Conn, error) {
	return fsutil.DialUnix(ctx, s.Dir, name)
}

// client speaks HTTP to the sandbox's socket name.
func (s Sandbox) client(name string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return s.dial(ctx, name) },
		DisableKeepAlives: true,
	}}
}

func (s Sandbox) do(ctx context.Context, name, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://ask"+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client(name).Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking %s of %s: %w", serverOf(name), s.Project, err)
	}
	return resp, nil
}

// serverOf names who serves the socket name, for messages.
func serverOf(name string) string {
	if name == LauncherSocketName {
		return "the launcher"
	}
	return "the gateway"
}

// Pending returns the sandbox's pending requests (of every socket of its
// ask directory), oldest first.
func (s Sandbox) Pending(ctx context.Context) ([]Request, error) {
	var all []Request
	var errs []error
	names := s.sockets()
	for _, name := range names {
		reqs, err := s.pending(ctx, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		all = append(all, reqs...)
	}
	if len(errs) == len(names) && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortStableFunc(all, func(x, y Request) int { return x.Created.Compare(y.Created) })
	return all, nil
}

func (s Sandbox) pending(ctx context.Context, name string) ([]Request, error) {
	resp, err := s.do(ctx, name, http.MethodGet, "/v1/requests", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := statusError(s, name, resp); err != nil {
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

// rescan is how often a watch looks for a socket that has appeared in the
// ask directory (the gateway's starts after the launcher's).
const rescan = 250 * time.Millisecond

// WatchAttached is Watch that calls attached (when not nil) once every
// server of the sandbox (each socket of its ask directory) counts it as an
// approver, before any event. It watches each socket, and those that
// appear while it runs (a sandbox announced before it starts has none
// yet); calls of fn are never concurrent. It ends when ctx does (nil), or
// when a server it watched goes away, or the ask directory does (an error:
// the sandbox ends).
func (s Sandbox) WatchAttached(ctx context.Context, attached func(), fn func(Event)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	serial := func(ev Event) { mu.Lock(); defer mu.Unlock(); fn(ev) }
	type end struct {
		name      string
		connected bool
		err       error
	}
	ended := make(chan end, 16)
	watching := map[string]bool{}
	tick := time.NewTicker(rescan)
	defer tick.Stop()
	for first := true; ; first = false {
		names := s.sockets()
		if len(names) == 0 && !s.exists() {
			return fmt.Errorf("watching the requests of %s: the sandbox is gone", s.Project)
		}
		var wg sync.WaitGroup
		for _, name := range names {
			if watching[name] {
				continue
			}
			watching[name] = true
			wg.Add(1)
			go func() {
				connected, err := s.watch(ctx, name, wg.Done, serial)
				ended <- end{name, connected, err}
			}()
		}
		if first {
			wg.Wait() // each attached, or failed to
			if attached != nil {
				attached()
			}
		}
		for again := true; again; {
			select {
			case e := <-ended:
				if ctx.Err() != nil {
					return nil
				}
				if e.connected {
					return e.err
				}
				watching[e.name] = false // not served yet (or any more): looked at again
			case <-ctx.Done():
				return nil
			case <-tick.C:
				again = false
			}
		}
	}
}

// watch watches the socket name until ctx ends (nil) or its server goes
// away (an error); connected says whether it got to watch. attached is
// called once, whether it attached or failed to.
func (s Sandbox) watch(ctx context.Context, name string, attached func(), fn func(Event)) (connected bool, err error) {
	once := sync.OnceFunc(attached)
	defer once()
	resp, err := s.do(ctx, name, http.MethodGet, "/v1/watch", nil)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if err := statusError(s, name, resp); err != nil {
		return false, err
	}
	once()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return true, fmt.Errorf("reading the requests of %s: %w", s.Project, err)
		}
		fn(ev)
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return true, fmt.Errorf("watching the requests of %s: %w", s.Project, err)
	}
	return true, fmt.Errorf("watching the requests of %s: %s went away", s.Project, serverOf(name))
}

// Decide answers the pending request id, at whichever socket has it;
// ErrGone when none does.
func (s Sandbox) Decide(ctx context.Context, id string, d Decision) error {
	if err := d.Validate(); err != nil {
		return err
	}
	b, _ := json.Marshal(d)
	for _, name := range s.sockets() {
		resp, err := s.do(ctx, name, http.MethodPost, "/v1/requests/"+id, bytes.NewReader(b))
		if err != nil {
			continue // a server that is gone has nothing pending
		}
		if resp.StatusCode == http.StatusNotFound {
			resp.Body.Close()
			continue
		}
		err = statusError(s, name, resp)
		resp.Body.Close()
		return err
	}
	return fmt.Errorf("request %s: %w", id, ErrGone)
}

func statusError(s Sandbox, name string, resp *http.Response) error {
	if resp.StatusCode/100 == 2 {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return fmt.Errorf("%s of %s: %s: %s", serverOf(name), s.Project, resp.Status, strings.TrimSpace(string(msg)))
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
