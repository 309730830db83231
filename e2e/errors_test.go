package e2e

// Each way of not being able to run a sandbox gets its own message and a hint
// that says what to do, with no links or contacts of other projects. The
// engine problems are staged with sockets the test makes itself (none, a dead
// one, one the user may not open, a fake old engine), so they need the
// launcher but no engine; missing images and untrusted profiles need one.

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// errorsSandbox is newSandbox for tests that need the launcher but
// no engine: nothing is checked on an engine in cleanup.
func errorsSandbox(t *testing.T) *sandbox {
	t.Helper()
	launcher = testenv.Launcher(t)
	s := makeSandbox(t)
	return s
}

// errorsMessage is what the launcher said on stderr: its error and hint lines.
type errorsMessage struct {
	errors, hints []string
}

func errorsParse(stderr string) errorsMessage {
	var m errorsMessage
	for _, line := range strings.Split(stderr, "\n") {
		if e, ok := strings.CutPrefix(line, "propio-sandbox: error: "); ok {
			m.errors = append(m.errors, e)
		} else if h, ok := strings.CutPrefix(line, "propio-sandbox: hint: "); ok {
			m.hints = append(m.hints, h)
		}
	}
	return m
}

// errorsCheck checks the exit code, that the error and hint lines contain
// the wanted words (case-insensitively), and that no hint sends the user
// anywhere on the web.
func errorsCheck(t *testing.T, r Result, code int, inError, inHint []string) {
	t.Helper()
	t.Logf("exit %d, stderr:\n%s", r.Code, r.Stderr)
	if r.Code != code {
		t.Errorf("want exit %d:\n%s", code, r)
	}
	m := errorsParse(r.Stderr)
	errs, hints := strings.ToLower(strings.Join(m.errors, "\n")), strings.ToLower(strings.Join(m.hints, "\n"))
	for _, w := range inError {
		if !strings.Contains(errs, strings.ToLower(w)) {
			t.Errorf("the error lines do not say %q:\n%s", w, r)
		}
	}
	for _, w := range inHint {
		if !strings.Contains(hints, strings.ToLower(w)) {
			t.Errorf("the hint lines do not say %q:\n%s", w, r)
		}
	}
	if len(inHint) > 0 && len(m.hints) == 0 {
		t.Errorf("no hint line:\n%s", r)
	}
	if strings.Contains(hints, "http") {
		t.Errorf("a hint points to a web address:\n%s", r)
	}
	for _, w := range []string{"https://", "http://", "docs.docker.com", "github.com", "support"} {
		if strings.Contains(strings.ToLower(r.Stderr), w) {
			t.Errorf("stderr mentions %q, a link or contact of another project:\n%s", w, r)
		}
	}
}

// errorsSocketDir is a directory for sockets, whose paths may be at most 108
// bytes, readable by every user.
func errorsSocketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "propio-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// errorsFakeEngine serves a minimal engine API on a unix socket in dir: _ping and
// version, answering as an engine of the given API version would.
func errorsFakeEngine(t *testing.T, dir, apiVersion, version string) string {
	t.Helper()
	path := filepath.Join(dir, "engine.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var requests []string
	mux := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("API-Version", apiVersion)
		w.Header().Set("OSType", "linux")
		w.Header().Set("Server", "Docker/"+version+" (linux)")
		switch {
		case strings.HasSuffix(r.URL.Path, "/_ping"):
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if r.Method != http.MethodHead {
				w.Write([]byte("OK"))
			}
		case strings.HasSuffix(r.URL.Path, "/version"):
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]string{"ApiVersion": apiVersion, "Version": version, "MinAPIVersion": "1.12", "Os": "linux"})
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]string{"message": "page not found"})
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Close()
		mu.Lock()
		defer mu.Unlock()
		t.Logf("the fake engine was asked: %v", requests)
	})
	return path
}

// errorsRunCmd runs a prepared launcher command, bounded by its context.
func errorsRunCmd(t *testing.T, ctx context.Context, cmd *exec.Cmd) Result {
	t.Helper()
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String(), Code: cleanupExitCode(err)}
	if ctx.Err() != nil {
		t.Fatalf("propio-sandbox %v did not finish in time:\n%s", cmd.Args[1:], r)
	}
	if r.Code < 0 {
		t.Fatalf("running propio-sandbox %v: %v", cmd.Args[1:], err)
	}
	return r
}

func TestErrorNoEngine(t *testing.T) {
	for _, tc := range []struct {
		name           string
		dockerOnPath   bool
		inError        []string
		inHint         []string
		notInHintOrErr string
	}{
		{"not installed", false, []string{"Docker is required"}, []string{"install"}, "start the Docker daemon"},
		{"installed, not started", true, []string{"not running"}, []string{"start the Docker daemon"}, "Docker is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := errorsSandbox(t)
			p := s.Profile("network: {mode: none}\n")
			bin := t.TempDir()
			if tc.dockerOnPath {
				// Only its presence counts: the launcher never runs it.
				if err := os.WriteFile(filepath.Join(bin, "docker"), []byte("#!/bin/sh\nexit 99\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			missing := filepath.Join(t.TempDir(), "missing.sock")
			s.Env = append(s.Env, "PATH="+bin, "DOCKER_HOST=unix://"+missing)
			r := s.Run("", "run", "-p", p, "--", "exit", "0")
			errorsCheck(t, r, 3, append(tc.inError, "preflight check engine failed", missing), tc.inHint)
			if strings.Contains(r.Stderr, tc.notInHintOrErr) {
				t.Errorf("stderr says %q, which is the other case's advice:\n%s", tc.notInHintOrErr, r)
			}
		})
	}
}

// TestErrorNotRunning: a socket file with nothing listening, as a stopped
// engine leaves behind.
func TestErrorNotRunning(t *testing.T) {
	s := errorsSandbox(t)
	p := s.Profile("network: {mode: none}\n")
	path := filepath.Join(errorsSocketDir(t), "dead.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the dead socket file should stay: %v", err)
	}
	s.Env = append(s.Env, "DOCKER_HOST=unix://"+path)
	// run fails its engine preflight check (exit 3); the other commands
	// fail plainly (exit 1).
	for _, args := range [][]string{{"run", "-p", p, "--", "exit", "0"}, {"ls"}, {"gc"}} {
		r := s.Run("", args...)
		code, inError := 1, []string{"not running", path}
		if args[0] == "run" {
			code, inError = 3, append(inError, "preflight check engine failed")
		}
		errorsCheck(t, r, code, inError, []string{"start the Docker daemon"})
	}
}

func TestErrorPermissionDenied(t *testing.T) {
	s := errorsSandbox(t)
	p := s.Profile("network: {mode: none}\n")
	dir := errorsSocketDir(t)
	sock := errorsFakeEngine(t, dir, "1.41", "20.10.24")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := s.Command(ctx, "run", "-p", p, "--", "exit", "0")
	cmd.Env = append(cmd.Env, "DOCKER_HOST=unix://"+sock)
	if os.Geteuid() == 0 {
		// root may open any socket: run the launcher as a user outside the
		// docker group, against a socket only root may open.
		if err := os.Chmod(sock, 0o600); err != nil {
			t.Fatal(err)
		}
		const uid = 4242
		errorsAsUser(t, s, uid, cmd)
	} else {
		t.Logf("not root: cannot run the launcher as another user; making the socket unopenable (mode 000) instead")
		if err := os.Chmod(sock, 0); err != nil {
			t.Fatal(err)
		}
	}
	r := errorsRunCmd(t, ctx, cmd)
	errorsCheck(t, r, 3, []string{"preflight check engine failed", "permission denied", sock}, []string{"docker group"})
}

// errorsAsUser makes cmd run as uid (gid the same, no supplementary groups), with
// a copy of the launcher and the sandbox's directories it can use.
func errorsAsUser(t *testing.T, s *sandbox, uid int, cmd *exec.Cmd) {
	t.Helper()
	// t.TempDir's parent and the build directory are private to root.
	for _, d := range []string{filepath.Dir(filepath.Dir(s.Workspace)), filepath.Dir(s.Workspace)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{s.Workspace, s.Home} {
		err := filepath.Walk(d, func(path string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(path, uid, uid)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	bin := errorsSocketDir(t)
	data, err := os.ReadFile(launcher)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Path = filepath.Join(bin, "propio-sandbox")
	if err := os.WriteFile(cmd.Path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}}
}

func TestErrorEngineTooOld(t *testing.T) {
	s := errorsSandbox(t)
	p := s.Profile("network: {mode: none}\n")
	sock := errorsFakeEngine(t, errorsSocketDir(t), "1.24", "1.12.0")
	s.Env = append(s.Env, "DOCKER_HOST=unix://"+sock)
	r := s.Run("", "run", "-p", p, "--", "exit", "0")
	errorsCheck(t, r, 3, []string{"preflight check engine failed", "too old", "1.24"}, []string{"upgrade"})
}

func TestErrorImageMissing(t *testing.T) {
	const image = "propio-sandbox-e2e/does-not-exist:1"
	s := newSandbox(t)
	if out, err := docker("image", "inspect", image); err == nil {
		t.Fatalf("%s exists on the engine; the test needs it missing:\n%s", image, out)
	}

	t.Run("no build section", func(t *testing.T) {
		p := s.Profile("image: " + image + "\nnetwork: {mode: none}\n")
		r := s.Run("", "run", "-p", p, "--", "exit", "0")
		errorsCheck(t, r, 3, []string{"preflight check image failed", image}, []string{"never pulls"})
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("a failed run left %v", left)
		}
	})

	// A missing image with a build section is built by the first run
	// (TestBuild), unless the build reads what the agent can change and is
	// not trusted as it is: then run refuses before it builds anything.
	t.Run("untrusted build section", func(t *testing.T) {
		p := s.Profile("image: " + image + "\nbuild:\n  context: ${WORKSPACE}\nnetwork: {mode: none}\n")
		if err := os.WriteFile(filepath.Join(s.Workspace, "Dockerfile"), []byte("FROM "+ProbeImage+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		r := s.Run("", "run", "-p", p, "--", "exit", "0")
		errorsCheck(t, r, 3, []string{"preflight check image failed", image}, []string{"propio-sandbox trust"})
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("a failed run left %v", left)
		}
		if _, err := docker("image", "inspect", image); err == nil {
			docker("image", "rm", image)
			t.Errorf("run built %s from an untrusted Dockerfile in the workspace", image)
		}
	})
}

// TestErrorUntrustedProfile: a repository profile runs only once trusted,
// and only as it was when trusted.
func TestErrorUntrustedProfile(t *testing.T) {
	s := newSandbox(t)
	dir := filepath.Join(s.Workspace, ".propio")
	file := filepath.Join(dir, "sandbox.yaml")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(yaml string) {
		if err := os.WriteFile(file, []byte("image: "+ProbeImage+"\n"+yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	store := filepath.Join(s.Home, ".local", "state", "propio-sandbox")
	refused := func(t *testing.T) {
		t.Helper()
		r := s.Run("", "run", "--", "exit", "0")
		errorsCheck(t, r, 3, []string{"preflight check trust failed", "sandbox.yaml"}, []string{"propio-sandbox trust"})
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("a refused run left %v", left)
		}
	}

	write("network: {mode: none}\n")
	t.Run("new", func(t *testing.T) {
		refused(t)
		if _, err := os.Stat(filepath.Join(store, "trusted.json")); err == nil {
			t.Errorf("a refused run wrote the trust store")
		}
	})
	t.Run("trusted", func(t *testing.T) {
		if r := s.Run("", "trust"); r.Code != 0 {
			t.Fatalf("trust failed:\n%s", r)
		}
		if r := s.Run("", "run", "--", "exit", "0"); r.Code != 0 {
			t.Errorf("want the trusted profile to run:\n%s", r)
		}
	})
	t.Run("changed", func(t *testing.T) {
		write("network: {mode: open}\n")
		refused(t)
	})
}

// TestErrorCommandNotFound: a command the image does not have ends with
// the code a shell gives (127), and a hint that says so, naming the image
// (the sandbox's init says only that its exec failed).
func TestErrorCommandNotFound(t *testing.T) {
	requireAgentImage(t)
	s := newSandbox(t)
	p := s.Profile("image: " + agentImage + "\nnetwork: {mode: none}\n")
	r := s.Run("", "run", "-p", p, "--", "no-such-command", "test")
	errorsCheck(t, r, 127, nil, []string{"`no-such-command`", "was not found in the image " + agentImage})
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("the run left %v", left)
	}
}
