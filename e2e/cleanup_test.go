package e2e

// However a run ends (exit, error, signal, timeout, interruption while the
// container is being created, parallel runs), the launcher removes every
// container, network and volume of its sandbox before it exits; and what a
// SIGKILLed launcher could not remove, `gc` or the next run removes.
//
// Each test checks right after the launcher exits, with s.Leftovers(), that
// nothing of the workspace remains: AutoRemove is asynchronous, so the
// launcher must wait until the engine has really removed everything.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestCleanupExit(t *testing.T) {
	s := newSandbox(t)
	p := s.Profile("network: {mode: none}\n")
	for _, tc := range []struct {
		name string
		code int
	}{
		{"normal exit", 0},
		{"error exit", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.Run("", "run", "-p", p, "--", "exit", strconv.Itoa(tc.code))
			if r.Code != tc.code {
				t.Fatalf("want exit %d:\n%s", tc.code, r)
			}
			if left := s.Leftovers(); len(left) > 0 {
				t.Errorf("the launcher exited while these remained: %v\n%s", left, r)
			}
		})
	}
}

// TestCleanupSignal sends a signal to the launcher while the sandbox's
// command runs: the command gets it, the launcher exits as the command did
// (128+signal), and nothing remains.
func TestCleanupSignal(t *testing.T) {
	s := newSandbox(t)
	p := s.Profile("network: {mode: none}\n")
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{
		{syscall.SIGINT, 130},
		{syscall.SIGTERM, 143},
		{syscall.SIGHUP, 129},
	} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
			l.waitStdout(t, "ready", time.Minute)
			l.signal(t, tc.sig)
			r := l.wait(t, time.Minute)
			if left := s.Leftovers(); len(left) > 0 {
				t.Errorf("the launcher exited while these remained: %v", left)
			}
			if !strings.Contains(r.Stdout, "got "+tc.sig.String()) {
				t.Errorf("the sandbox's command did not get %v (it prints %q when it does):\n%s", tc.sig, "got "+tc.sig.String(), r)
			}
			if r.Code != tc.code {
				t.Errorf("want exit %d after %v:\n%s", tc.code, tc.sig, r)
			}
		})
	}
}

func TestCleanupTimeout(t *testing.T) {
	s := newSandbox(t)
	p := s.Profile("network: {mode: none}\nresources: {timeout: 3s}\n")
	start := time.Now()
	r := s.Run("", "run", "-p", p, "--", "sleep", "1m")
	took := time.Since(start)
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("the launcher exited while these remained: %v", left)
	}
	if r.Code != 124 {
		t.Errorf("want exit 124 after the timeout:\n%s", r)
	}
	if took > 20*time.Second {
		t.Errorf("a 3s timeout took %s to end the run", took.Round(time.Millisecond))
	}
	if !strings.Contains(r.Stderr, "3s") || !strings.Contains(r.Stderr, "time") {
		t.Errorf("stderr does not say the run stopped after its 3s timeout:\n%s", r)
	}
	t.Logf("timed out run took %s", took.Round(time.Millisecond))
}

// TestCleanupInterruptDuringCreate interrupts the launcher at the one moment
// a container exists that the launcher has not heard of yet: the engine has
// created it, the response is on its way. A proxy between launcher and engine
// holds that response until the launcher has had SIGINT. The launcher must
// still find and remove the container.
func TestCleanupInterruptDuringCreate(t *testing.T) {
	s := newSandbox(t)
	r, _ := cleanupInterruptAt(t, s, "/containers/create", holdResponse, "created a container", func() {
		if left := s.Leftovers(); len(left) == 0 {
			t.Errorf("the engine has no container while the create's response is held; the test proves nothing")
		}
	})
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("the container created as the launcher was interrupted remains: %v\n%s", left, r)
	}
	if r.Code == 0 {
		t.Errorf("want a non-zero exit after SIGINT:\n%s", r)
	}
	if !strings.Contains(r.Stderr, "interrupted") {
		t.Errorf("stderr does not say the run was interrupted:\n%s", r)
	}
	if strings.Contains(r.Stdout, "ready") {
		t.Errorf("the command started although the launcher was interrupted before:\n%s", r)
	}
}

// TestCleanupInterruptDuringStart interrupts the launcher after the container
// is created but before it runs: the proxy holds the request to attach to it
// (the step before starting it) until the launcher has had SIGINT. Ctrl-C
// must not be lost there: the launcher ends at once, not when the command
// would have ended a minute later, and removes the container.
func TestCleanupInterruptDuringStart(t *testing.T) {
	s := newSandbox(t)
	r, took := cleanupInterruptAt(t, s, "/attach", holdRequest, "attached to a container", nil)
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("the launcher exited while these remained: %v", left)
	}
	if took > 20*time.Second {
		t.Errorf("the launcher went on for %s after SIGINT (the command sleeps 1m): the signal was lost", took.Round(time.Second))
	}
	if r.Code == 0 {
		t.Errorf("want a non-zero exit after SIGINT:\n%s", r)
	}
}

// TestCleanupInterruptAllowlistBeforeCreate interrupts an allowlist
// sandbox's launcher after its gateway runs and before the command's
// container is created: the proxy holds that create until the launcher has
// had SIGINT. The gateway running must not make the sandbox look started
// (the signal would be lost and the command run its minute): the launcher
// ends at once, the command never starts, and nothing remains.
func TestCleanupInterruptAllowlistBeforeCreate(t *testing.T) {
	s := newSandbox(t)
	yaml := "network:\n  mode: allowlist\n  allow: [allowed.test]\n"
	r, took := cleanupInterruptOf(t, s, yaml, "/containers/create?name=-run-", holdRequest, "asked to create the command's container", func() {
		if left := s.Leftovers(); len(left) == 0 {
			t.Errorf("no gateway runs while the command's create is held; the test proves nothing")
		}
	})
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("the launcher exited while these remained: %v", left)
	}
	if took > 20*time.Second {
		t.Errorf("the launcher went on for %s after SIGINT (the command sleeps 1m): the signal was lost", took.Round(time.Second))
	}
	if r.Code != 130 {
		t.Errorf("want exit 130 after SIGINT:\n%s", r)
	}
	if strings.Contains(r.Stdout, "ready") {
		t.Errorf("the command started although the launcher was interrupted before:\n%s", r)
	}
}

// cleanupInterruptAt runs `run -- sleep 1m` through a proxy that holds the
// engine call to path (before the engine has it, or once it has answered),
// calls whileHeld (if any) during the hold, sends the launcher SIGINT, lets
// the call go 200ms later, and returns how the launcher ended and how long
// it took after the release. what names the step in failures.
func cleanupInterruptAt(t *testing.T, s *sandbox, path string, hold cleanupHold, what string, whileHeld func()) (Result, time.Duration) {
	t.Helper()
	return cleanupInterruptOf(t, s, "network: {mode: none}\n", path, hold, what, whileHeld)
}

// cleanupInterruptOf is cleanupInterruptAt for the profile yaml. A path
// with a query (`/containers/create?name=-run-`) holds only a call whose
// query parameter contains that text.
func cleanupInterruptOf(t *testing.T, s *sandbox, yaml, path string, hold cleanupHold, what string, whileHeld func()) (Result, time.Duration) {
	t.Helper()
	p := s.Profile(yaml)
	px := cleanupStartProxy(t, path, hold)
	s.Env = append(s.Env, "DOCKER_HOST=unix://"+px.socket)

	l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	select {
	case <-px.seen:
	case <-l.done:
		t.Fatalf("the launcher ended before it %s:\n%s", what, l.result())
	case <-time.After(time.Minute):
		l.kill()
		t.Fatalf("the proxy saw no %s within a minute:\n%s", path, l.result())
	}
	if whileHeld != nil {
		whileHeld()
	}
	l.signal(t, syscall.SIGINT)
	time.Sleep(200 * time.Millisecond)
	close(px.release)
	start := time.Now()
	r := l.wait(t, 2*time.Minute)
	took := time.Since(start)
	t.Logf("interrupted at %s, ended %s after the release:\n%s", path, took.Round(time.Millisecond), r)
	return r, took
}

// TestCleanupKilledLauncher: a SIGKILLed launcher cannot clean up, and
// neither can its watchdog when it is killed too (else it removes the
// sandbox at once: TestDiskKilledLauncher); `gc` and the next run in the
// workspace remove what they left.
func TestCleanupKilledLauncher(t *testing.T) {
	s := newSandbox(t)
	p := s.Profile("network: {mode: none}\n")

	killed := func(t *testing.T) string {
		t.Helper()
		l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
		l.waitStdout(t, "ready", time.Minute)
		killWatchdog(t, l.cmd.Process.Pid)
		l.signal(t, syscall.SIGKILL)
		l.wait(t, time.Minute) // reaped: a zombie would still look alive to gc
		projects := cleanupProjects(t, s)
		if len(projects) != 1 {
			t.Fatalf("want the killed launcher's container to remain, found projects %v (leftovers %v)", projects, s.Leftovers())
		}
		return projects[0]
	}

	t.Run("gc", func(t *testing.T) {
		project := killed(t)
		r := s.Run("", "gc")
		if r.Code != 0 || !strings.Contains(r.Stdout, "removed "+project) {
			t.Errorf("want gc to remove and print %s:\n%s", project, r)
		}
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("gc exited while these remained: %v", left)
		}
	})

	t.Run("next run reaps", func(t *testing.T) {
		project := killed(t)
		r := s.Run("", "run", "-p", p, "--", "exit", "0")
		if r.Code != 0 {
			t.Fatalf("want exit 0:\n%s", r)
		}
		if !strings.Contains(r.Stderr, "leftover") || !strings.Contains(r.Stderr, project) {
			t.Errorf("stderr does not say the run removed the leftover %s:\n%s", project, r)
		}
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("the launcher exited while these remained: %v", left)
		}
	})

	// Every run starts with a gc, so launchers started together collect the
	// same leftover together; none of them may fail or warn for it.
	t.Run("concurrent gc", func(t *testing.T) {
		project := killed(t)
		const n = 4
		results := s.RunAll(n, "gc")
		reported := false
		for i, r := range results {
			if r.Code != 0 || r.Stderr != "" {
				t.Errorf("gc %d of %d at once: want exit 0 and nothing on stderr:\n%s", i, n, r)
			}
			reported = reported || strings.Contains(r.Stdout, "removed "+project)
		}
		if !reported {
			t.Errorf("no gc printed that it removed %s", project)
		}
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("the gcs exited while these remained: %v", left)
		}
	})
}

// TestCleanupParallel runs eight sandboxes at once in one directory.
func TestCleanupParallel(t *testing.T) {
	s := newSandbox(t)
	p := s.Profile("network: {mode: none}\n")
	const n = 8
	results := s.RunAll(n, "run", "-p", p, "--", "id")
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("the launchers exited while these remained: %v", left)
	}
	for i, r := range results {
		if r.Code != 0 || !strings.Contains(r.Stdout, "cwd=/workspace") {
			t.Errorf("run %d: want exit 0 and the probe's id from /workspace:\n%s", i, r)
		}
	}
}

func TestCleanupList(t *testing.T) {
	s := newSandbox(t)
	p := s.Profile("network: {mode: none}\n")
	l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	l.waitStdout(t, "ready", time.Minute)
	defer func() {
		l.signal(t, syscall.SIGTERM)
		if r := l.wait(t, time.Minute); r.Code != 143 {
			t.Errorf("want exit 143 after SIGTERM:\n%s", r)
		}
	}()
	projects := cleanupProjects(t, s)
	if len(projects) != 1 {
		t.Fatalf("want one project for the running sandbox, found %v", projects)
	}
	project := projects[0]

	r := s.Run("", "ls")
	if r.Code != 0 {
		t.Fatalf("ls failed:\n%s", r)
	}
	var row string
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(line, project+" ") {
			row = line
		}
	}
	if row == "" || !strings.Contains(row, " "+s.Workspace+" ") {
		t.Errorf("ls has no row for %s with workspace %s:\n%s", project, s.Workspace, r)
	}

	r = s.Run("", "ls", "--json")
	if r.Code != 0 {
		t.Fatalf("ls --json failed:\n%s", r)
	}
	var list []struct {
		Project   string `json:"project"`
		Workspace string `json:"workspace"`
		PID       int    `json:"launcher_pid"`
		Alive     bool   `json:"launcher_alive"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &list); err != nil {
		t.Fatalf("ls --json is not a JSON array of sandboxes: %v\n%s", err, r)
	}
	found := false
	for _, e := range list {
		if e.Project != project {
			continue
		}
		found = true
		if e.Workspace != s.Workspace || !e.Alive || e.PID != l.cmd.Process.Pid {
			t.Errorf("ls --json entry %+v: want workspace %s, launcher_pid %d, launcher_alive true", e, s.Workspace, l.cmd.Process.Pid)
		}
	}
	if !found {
		t.Errorf("ls --json has no entry for %s:\n%s", project, r.Stdout)
	}
}

// cleanupProjects lists the projects of the workspace's containers.
func cleanupProjects(t *testing.T, s *sandbox) []string {
	t.Helper()
	out, err := docker("ps", "-a", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace,
		"--format", `{{.Label "dev.propio-sandbox.project"}}`)
	if err != nil {
		t.Fatalf("listing the workspace's containers: %v", err)
	}
	return strings.Fields(out)
}

// cleanupProc is a launcher running in the background.
type cleanupProc struct {
	cmd            *exec.Cmd
	cancel         context.CancelFunc
	stdout, stderr *cleanupBuffer
	done           chan struct{} // closed when it has exited
	err            error         // from Wait, once done
}

// cleanupStart starts propio-sandbox with args in the workspace, killed
// after two minutes at the latest.
func cleanupStart(t *testing.T, s *sandbox, args ...string) *cleanupProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	l := &cleanupProc{cancel: cancel, stdout: newCleanupBuffer(), stderr: newCleanupBuffer(), done: make(chan struct{})}
	l.cmd = s.Command(ctx, args...)
	l.cmd.Stdout, l.cmd.Stderr = l.stdout, l.stderr
	l.cmd.WaitDelay = 10 * time.Second
	if err := l.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting propio-sandbox %v: %v", args, err)
	}
	go func() {
		l.err = l.cmd.Wait()
		close(l.done)
	}()
	t.Cleanup(func() {
		l.kill()
		<-l.done
	})
	return l
}

// waitStdout waits until stdout has text, or fails the test.
func (l *cleanupProc) waitStdout(t *testing.T, text string, limit time.Duration) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for !strings.Contains(l.stdout.String(), text) {
		select {
		case <-l.stdout.changed:
		case <-l.done:
			if strings.Contains(l.stdout.String(), text) {
				return
			}
			t.Fatalf("propio-sandbox exited before printing %q:\n%s", text, l.result())
		case <-deadline.C:
			l.kill()
			<-l.done
			t.Fatalf("propio-sandbox did not print %q within %s:\n%s", text, limit, l.result())
		}
	}
}

func (l *cleanupProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := l.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("sending %v to the launcher: %v", sig, err)
	}
}

func (l *cleanupProc) kill() {
	l.cmd.Process.Kill()
	l.cancel()
}

// wait waits for the launcher to exit, or kills it and fails the test.
func (l *cleanupProc) wait(t *testing.T, limit time.Duration) Result {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(limit):
		l.kill()
		<-l.done
		t.Fatalf("propio-sandbox did not exit within %s:\n%s", limit, l.result())
	}
	l.cancel()
	return l.result()
}

// result is what the launcher printed so far, and its exit code once done
// (-1 when a signal ended it).
func (l *cleanupProc) result() Result {
	r := Result{Stdout: l.stdout.String(), Stderr: l.stderr.String()}
	select {
	case <-l.done:
		r.Code = cleanupExitCode(l.err)
	default:
		r.Code = -1
	}
	return r
}

func cleanupExitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}

// cleanupBuffer is a buffer that is safe to read while a process writes to
// it, and tells when it grows.
type cleanupBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newCleanupBuffer() *cleanupBuffer { return &cleanupBuffer{changed: make(chan struct{}, 1)} }

func (b *cleanupBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case b.changed <- struct{}{}:
	default:
	}
	return b.buf.Write(p)
}

func (b *cleanupBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// cleanupProxy forwards the engine API from its own socket to the real
// engine's, but holds the first POST whose path ends in a given suffix:
// before the engine has it (holdRequest) or once the engine has answered
// it (holdResponse). seen is closed when the hold begins; the request or the
// response goes on once release is closed.
type cleanupProxy struct {
	socket  string
	seen    chan struct{}
	release chan struct{}
}

type cleanupHold int

const (
	holdRequest cleanupHold = iota
	holdResponse
)

func cleanupStartProxy(t *testing.T, path string, when cleanupHold) *cleanupProxy {
	t.Helper()
	return cleanupStartProxyFor(t, http.MethodPost, path, when)
}

// cleanupStartProxyFor is cleanupStartProxy for the first request of method
// whose path holds path (a suffix for POST).
func cleanupStartProxyFor(t *testing.T, method, path string, when cleanupHold) *cleanupProxy {
	t.Helper()
	return cleanupStartProxyTo(t, engineSocket(t), method, path, when)
}

// cleanupStartProxyTo is cleanupStartProxyFor to the engine whose socket is
// engine.
func cleanupStartProxyTo(t *testing.T, engine, method, path string, when cleanupHold) *cleanupProxy {
	t.Helper()
	dir, err := os.MkdirTemp("", "propio-proxy-") // short: socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	px := &cleanupProxy{socket: filepath.Join(dir, "engine.sock"), seen: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	suffix, query, _ := strings.Cut(path, "?")
	key, value, _ := strings.Cut(query, "=")
	hold := func(r *http.Request) {
		if r.Method != method || method == http.MethodPost && !strings.HasSuffix(r.URL.Path, suffix) || !strings.Contains(r.URL.Path, suffix) {
			return
		}
		if key != "" && !strings.Contains(r.URL.Query().Get(key), value) {
			return
		}
		first := false
		once.Do(func() { first = true; close(px.seen) })
		if !first {
			return
		}
		select {
		case <-px.release:
		case <-time.After(2 * time.Minute):
		}
	}
	transport := &cleanupTransport{
		base: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", engine)
		}},
		when: when,
		hold: hold,
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "docker"
			pr.Out.Host = pr.In.Host
		},
		Transport:     transport,
		FlushInterval: -1, // attach, wait, logs and events stream
	}
	ln, err := net.Listen("unix", px.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 30 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() {
		select {
		case <-px.release:
		default:
			close(px.release)
		}
		srv.Close()
	})
	return px
}

// cleanupTransport calls hold with each request before sending it, or once
// it has a response, as when says.
type cleanupTransport struct {
	base http.RoundTripper
	when cleanupHold
	hold func(*http.Request)
}

func (h *cleanupTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.when == holdRequest {
		h.hold(r)
	}
	resp, err := h.base.RoundTrip(r)
	if err == nil && h.when == holdResponse {
		h.hold(r)
	}
	return resp, err
}

// TestRenderNamesTheRun: render names the project exactly as run starts it;
// a second sandbox of the workspace, while the first runs, takes NAME-2
// (and both are removed when they end).
func TestRenderNamesTheRun(t *testing.T) {
	s := newSandbox(t)
	s.uniqueWorkspace() // other tests' sandboxes take propio-workspace-N
	p := s.Profile("network: {mode: none}\n")
	r := s.Run("", "render", "-p", p)
	if r.Code != 0 {
		t.Fatalf("render failed:\n%s", r)
	}
	var name string
	for _, line := range strings.Split(r.Stdout, "\n") {
		if v, ok := strings.CutPrefix(line, "name: "); ok {
			name = v
		}
	}
	if name == "" {
		t.Fatalf("render printed no project name:\n%s", r)
	}
	first := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	first.waitStdout(t, "ready", time.Minute)
	second := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	second.waitStdout(t, "ready", time.Minute)
	projects := cleanupProjects(t, s)
	slices.Sort(projects)
	if want := []string{name, name + "-2"}; !slices.Equal(projects, want) {
		t.Errorf("running sandboxes are %v, want %v (render's name, then the next)", projects, want)
	}
	for _, l := range []*cleanupProc{first, second} {
		l.signal(t, syscall.SIGTERM)
		if r := l.wait(t, time.Minute); r.Code != 143 {
			t.Errorf("want exit 143 after SIGTERM:\n%s", r)
		}
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// killWatchdog kills (SIGKILL) the watchdog of the launcher of pid and
// waits until it is dead: a test of what gc removes kills it before the
// launcher, as a machine that kills every process of the user would (else
// the watchdog removes the sandbox at once: TestDiskKilledLauncher).
func killWatchdog(t *testing.T, launcher int) {
	t.Helper()
	want := []string{"_background", "watch", "--launcher", strconv.Itoa(launcher)}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		args := strings.Split(string(b), "\x00")
		if err != nil || !slices.Contains(args, want[0]) || !slices.Contains(args, want[1]) || !slices.Contains(args, "--project") {
			continue
		}
		if i := slices.Index(args, want[2]); i < 0 || i+1 >= len(args) || args[i+1] != want[3] {
			continue
		}
		syscall.Kill(pid, syscall.SIGKILL)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			stat, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
			// Dead, or a zombie its parent (the launcher) has yet to reap:
			// its files (the name's lock) are closed either way.
			if _, after, ok := strings.Cut(string(stat), ") "); err != nil || ok && strings.HasPrefix(after, "Z") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the watchdog (pid %d) of launcher %d outlived SIGKILL", pid, launcher)
			}
		}
	}
	t.Fatalf("launcher %d has no watchdog", launcher)
}
