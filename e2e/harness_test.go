// Package e2e holds the end-to-end tests: they run the real propio-sandbox
// binary against a real engine and observe what happens (a file really is
// unreadable, a container really is gone). Without a reachable engine they
// skip, saying why, unless PROPIO_E2E=require, when they fail instead.
//
// Images come from nowhere but this machine: the probe image is FROM scratch
// with a static Go helper (e2e/probe). Network tests only reach servers the
// test started itself.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	launch "github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// ProbeImage is the image every scenario runs: FROM scratch plus /probe;
// requireEngine sets it to the tag testenv built (tests that need no engine
// see a name only).
var ProbeImage = testenv.ProbeImage

var probeImageOnce sync.Once

// launcher is the propio-sandbox binary under test, set by requireEngine.
var launcher string

// TestMain removes the built binaries when the tests end.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// requireEngine skips the test when no engine is reachable, or fails it
// when PROPIO_E2E=require; then it has the launcher and the probe image
// built, once for the whole run.
func requireEngine(t *testing.T) {
	t.Helper()
	launcher = testenv.RequireEngine(t)
	probeImageOnce.Do(func() { ProbeImage = testenv.ProbeImage })
}

func repoRoot() string { return testenv.RepoRoot() }

// sandbox is one test's world: a workspace and a home of its own, so that
// its resources can be found by their workspace label and nothing of the
// real user is touched.
type sandbox struct {
	t         *testing.T
	Workspace string // the directory propio-sandbox runs in
	Home      string // HOME, with XDG_CONFIG_HOME and XDG_STATE_HOME below it
	Env       []string
}

// newSandbox makes a workspace and home for one test, and checks in cleanup
// that nothing of the workspace's sandboxes remains on the engine.
func newSandbox(t *testing.T) *sandbox {
	t.Helper()
	requireEngine(t)
	s := makeSandbox(t)
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		s.Env = append(s.Env, "DOCKER_HOST="+h)
	}
	t.Cleanup(func() {
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("resources left behind for %s: %v", s.Workspace, left)
			s.forceRemove()
		}
	})
	return s
}

// makeSandbox makes the workspace, home and environment of one test.
func makeSandbox(t *testing.T) *sandbox {
	t.Helper()
	base := t.TempDir()
	if real, err := filepath.EvalSymlinks(base); err == nil {
		base = real
	}
	// The workspace's name is the test's own, and so are its sandboxes'
	// (propio-workspace-NAME): tests share the engine, and names are
	// claimed in each test's own state directory, so two tests' launches
	// of one name at the same moment met on the engine (Podman: a
	// gateway's address already allocated in the other's network).
	s := &sandbox{t: t, Workspace: filepath.Join(base, "workspace-"+randomID()), Home: filepath.Join(base, "home")}
	for _, d := range []string{s.Workspace, s.Home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + s.Home,
		"XDG_CONFIG_HOME=" + filepath.Join(s.Home, ".config"),
		"XDG_STATE_HOME=" + filepath.Join(s.Home, ".local", "state"),
		"PROPIO_HOME=" + repoRoot(),
		// Nothing prepared ahead, unless the test says so (Prepared): a
		// gateway made for a next run that never comes would only load the
		// engine the tests share.
		launch.EnvPrepare + "=0",
	}
	// The test's launchers' background work ends with the test: the next
	// test's sandboxes may take the same names.
	t.Cleanup(s.WaitBackground)
	return s
}

// Prepared lets the test's launches prepare gateways ahead, as a user's
// do, and removes what they prepared when the test ends (before the check
// for leftovers).
func (s *sandbox) Prepared() {
	s.Env = slices.DeleteFunc(s.Env, func(kv string) bool { return strings.HasPrefix(kv, launch.EnvPrepare+"=") })
	s.t.Cleanup(func() {
		if r := s.Run("", "gc", "--prepared"); r.Code != 0 {
			s.t.Errorf("removing what was prepared ahead: %s", r)
		}
	})
}

// dirs are the directories of the test's launchers.
func (s *sandbox) dirs() hostinfo.Dirs {
	return hostinfo.Dirs{Config: filepath.Join(s.Home, ".config", "propio-sandbox"), State: filepath.Join(s.Home, ".local", "state", "propio-sandbox")}
}

// WaitBackground waits (two minutes at most) until the background work of
// the workspace's launchers is done: what they handed over once their
// sandbox's command ended is removed, the gateway they had prepared ahead
// is ready.
func (s *sandbox) WaitBackground() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := launch.WaitBackground(ctx, s.dirs(), s.Workspace); err != nil {
		s.t.Errorf("waiting for the launchers' background work: %v", err)
	}
}

// Profile writes a profile file outside the workspace and returns its path.
// The image defaults to the probe's.
func (s *sandbox) Profile(yaml string) string {
	s.t.Helper()
	if !strings.Contains(yaml, "image:") {
		yaml = "image: " + ProbeImage + "\n" + yaml
	}
	dir, err := os.MkdirTemp(s.Home, "profile-")
	if err != nil {
		s.t.Fatal(err)
	}
	path := filepath.Join(dir, "profile.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		s.t.Fatal(err)
	}
	return path
}

// Result is how one launcher run ended.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// OwnStderr is what the launcher said of its own sandbox: its stderr
// without the note on other launchers' leftovers it removed, which tests
// sharing an engine may see at any launch.
func (r Result) OwnStderr() string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(r.Stderr, "\n") {
		if !strings.HasPrefix(line, "propio-sandbox: removed ") || !strings.Contains(line, " leftover sandbox(es) of launchers that are gone: ") {
			b.WriteString(line)
		}
	}
	return b.String()
}

func (r Result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
}

// Run runs propio-sandbox with args in the workspace, stdin from stdin (nil
// for none), bounded by two minutes.
func (s *sandbox) Run(stdin string, args ...string) Result {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := s.Command(ctx, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	return runCmd(s.t, ctx, cmd)
}

// runCmd runs a prepared command, bounded by its context, and returns how it
// ended; it fails the test when the command could not run or ran out of time.
func runCmd(t *testing.T, ctx context.Context, cmd *exec.Cmd) Result {
	t.Helper()
	r, err := execute(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// execute runs cmd and returns how it ended, or an error when it could not
// run or ran out of time. It is safe to call from any goroutine.
func execute(ctx context.Context, cmd *exec.Cmd) (Result, error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return r, fmt.Errorf("%v did not finish in time:\n%s", cmd.Args, r)
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		return r, fmt.Errorf("running %v: %v", cmd.Args, err)
	}
	return r, nil
}

// RunAll runs n launchers with the same arguments at once, each bounded by
// two minutes, and returns how each ended.
func (s *sandbox) RunAll(n int, args ...string) []Result {
	s.t.Helper()
	results := make([]Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			results[i], errs[i] = execute(ctx, s.Command(ctx, args...))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			s.t.Errorf("launcher %d of %d: %v", i+1, n, err)
		}
	}
	return results
}

// Command prepares a launcher process in the workspace with the test's
// environment (nothing else of the real one).
func (s *sandbox) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, launcher, args...)
	cmd.Dir = s.Workspace
	cmd.Env = append([]string(nil), s.Env...)
	return cmd
}

// Leftovers lists the containers, networks and volumes that carry this
// workspace's label, once the launchers' background work is done.
func (s *sandbox) Leftovers() []string {
	s.WaitBackground()
	label := "label=dev.propio-sandbox.workspace=" + s.Workspace
	var left []string
	for _, kind := range [][]string{
		{"ps", "-a", "--filter", label, "--format", "container {{.Names}} {{.Status}}"},
		{"network", "ls", "--filter", label, "--format", "network {{.Name}}"},
		{"volume", "ls", "--filter", label, "--format", "volume {{.Name}}"},
	} {
		out, err := docker(kind...)
		if err != nil {
			s.t.Errorf("listing leftovers: %v", err)
			continue
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if l != "" {
				left = append(left, l)
			}
		}
	}
	return left
}

func (s *sandbox) forceRemove() {
	label := "label=dev.propio-sandbox.workspace=" + s.Workspace
	if ids, _ := docker("ps", "-aq", "--filter", label); strings.TrimSpace(ids) != "" {
		docker(append([]string{"rm", "-f"}, strings.Fields(ids)...)...)
	}
	if ids, _ := docker("network", "ls", "-q", "--filter", label); strings.TrimSpace(ids) != "" {
		docker(append([]string{"network", "rm"}, strings.Fields(ids)...)...)
	}
	if ids, _ := docker("volume", "ls", "-q", "--filter", label); strings.TrimSpace(ids) != "" {
		docker(append([]string{"volume", "rm", "-f"}, strings.Fields(ids)...)...)
	}
}

// engineSocket is the unix socket of the engine the tests use; a test that
// needs the socket itself skips when the engine is reached another way.
func engineSocket(t *testing.T) string {
	t.Helper()
	h := os.Getenv("DOCKER_HOST")
	if h == "" {
		return "/var/run/docker.sock"
	}
	path, isUnix := strings.CutPrefix(h, "unix://")
	if !isUnix {
		t.Skipf("needs the engine's unix socket; DOCKER_HOST is %s", h)
	}
	return path
}

// engineRootless reports whether the tests' engine runs as an unprivileged
// user (a rootless Podman, as .ci/run's third pass has it), as the launcher
// tells it.
func engineRootless(t *testing.T) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eng, err := engine.Connect(ctx, engine.HostFromEnv(), engine.Streams{Out: io.Discard, Err: io.Discard})
	if err != nil {
		t.Fatalf("connecting to the engine: %v", err)
	}
	defer eng.Close()
	f, err := eng.Facts(ctx)
	if err != nil {
		t.Fatalf("the engine's facts: %v", err)
	}
	return f.Rootless
}

// docker runs the docker CLI for the tests' own observations.
func docker(args ...string) (string, error) { return testenv.Docker(args...) }

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// randomID is a short random hex string, for unique names.
func randomID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}
