package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/kubeapi"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// managed selects every object propio-sandbox made.
const managed = generator.KubeLabelManagedBy + "=" + generator.KubeManagedBy

// smallProfile writes a profile extending base with resources that fit the
// test node (two cores, shared by parallel tests), outside any workspace.
func smallProfile(t *testing.T, base, extra string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), base+"-small.yaml")
	text := fmt.Sprintf("version: 1\nextends: %s\nresources: {cpus: 0.5, memory: 512m}\n%s", base, extra)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// launcherOn is the launcher run in the workspace ws with the cluster of
// kubeconfig, and directories of the test's own.
func launcherOn(t *testing.T, kubeconfig, ws string, args ...string) *exec.Cmd {
	t.Helper()
	return launcherIn(t, kubeconfig, ws, t.TempDir(), args...)
}

// launcherIn is launcherOn with the directories of home (the changesets
// of one launcher seen by the next).
func launcherIn(t *testing.T, kubeconfig, ws, home string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(testenv.Launcher(t), args...)
	cmd.Dir = ws
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig,
		"XDG_STATE_HOME="+filepath.Join(home, "state"), "XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_CACHE_HOME="+filepath.Join(home, "cache"), "XDG_RUNTIME_DIR="+filepath.Join(home, "run"))
	return cmd
}

// kubeWorkspace makes a workspace holding hello.txt.
func kubeWorkspace(t *testing.T, name string) string {
	t.Helper()
	ws := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "hello.txt"), []byte("from the workspace"), 0o644); err != nil {
		t.Fatal(err)
	}
	return ws
}

// firstWriter notes when its first byte came.
type firstWriter struct {
	buf   bytes.Buffer
	first chan struct{}
}

func (w *firstWriter) Write(p []byte) (int, error) {
	if w.buf.Len() == 0 && len(p) > 0 {
		close(w.first)
	}
	return w.buf.Write(p)
}

// TestKubeLaunchRun runs `propio-sandbox run --engine kubernetes`: the
// workspace's file read inside, the input piped in, the output back, the
// sandbox's exit code the launcher's, and nothing left in the namespace
// after. It logs the time from run to the first output.
func TestKubeLaunchRun(t *testing.T) {
	c, kubeconfig := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ws := kubeWorkspace(t, "kubelaunch")
	prof := smallProfile(t, "offline", "")

	cmd := launcherOn(t, kubeconfig, ws, "run", "--engine", "kubernetes", "-n", ns, "-p", prof, "--",
		"bash", "-c", `cat hello.txt; echo; read line; echo "got:$line"; echo "term:$TERM"; echo to-stderr >&2; exit 7`)
	cmd.Stdin = strings.NewReader("typed input\n")
	// A passed variable's value reaches the sandbox (through the run's
	// Secret) and is in nothing the launcher says.
	const secret = "propio-kube-passed-4e1f"
	cmd.Env = append(cmd.Env, "TERM="+secret)
	out := &firstWriter{first: make(chan struct{})}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, &stderr
	start := time.Now()
	err := runBounded(t, cmd, 3*time.Minute)
	select {
	case <-out.first:
	default:
		t.Fatalf("run printed nothing: %v\nstderr:\n%s", err, stderr.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 7 {
		t.Fatalf("run: %v, want exit status 7\nstdout:\n%s\nstderr:\n%s", err, out.buf.String(), stderr.String())
	}
	t.Logf("run to the end: %v", time.Since(start))
	if strings.Contains(stderr.String(), secret) {
		t.Errorf("the launcher's stderr holds a passed variable's value:\n%s", stderr.String())
	}
	for _, want := range []string{"from the workspace\n", "got:typed input\n", "term:" + secret + "\n", "to-stderr\n"} {
		if !strings.Contains(out.buf.String(), want) {
			t.Errorf("output %q lacks %q", out.buf.String(), want)
		}
	}
	waitSelectedGone(t, c, ns, managed, 30*time.Second)

	// The time from run to the first output, with a command that prints
	// at once.
	cmd = launcherOn(t, kubeconfig, ws, "run", "--engine", "kubernetes", "-n", ns, "-p", prof, "--", "echo", "first")
	out = &firstWriter{first: make(chan struct{})}
	stderr.Reset()
	cmd.Stdout, cmd.Stderr = out, &stderr
	start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-out.first:
		t.Logf("from run to the first output: %v", time.Since(start))
	case err := <-done:
		t.Fatalf("run ended with no output: %v\nstderr:\n%s", err, stderr.String())
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("no output within 3 minutes\nstderr:\n%s", stderr.String())
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
		}
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("run did not end within 2 minutes of its output")
	}
	if out.buf.String() != "first\n" {
		t.Errorf("output %q, want %q", out.buf.String(), "first\n")
	}
	waitSelectedGone(t, c, ns, managed, 30*time.Second)
}

// TestKubeLaunchSignal: a SIGTERM to the launcher while the sandbox's
// command runs ends the run with 128+15, and removes everything it made on
// the cluster; in changeset mode, no changeset is kept (nothing came back).
func TestKubeLaunchSignal(t *testing.T) {
	c, kubeconfig := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ws := kubeWorkspace(t, "kubesignal")
	for _, mode := range []string{"rw", "changeset"} {
		t.Run(mode, func(t *testing.T) {
			home := t.TempDir()
			args := []string{"run", "--engine", "kubernetes", "-n", ns, "-p", smallProfile(t, "open", ""), "--", "sleep", "600"}
			if mode == "changeset" {
				args = append([]string{"run", "--changeset"}, args[1:]...)
			}
			cmd := launcherIn(t, kubeconfig, ws, home, args...)
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = io.Discard, &stderr
			done := startLauncher(t, cmd)
			waitSandboxRunning(t, c, ns, done, 2*time.Minute)
			terminate(t, cmd, done, &stderr)
			if !strings.Contains(stderr.String(), "interrupted") {
				t.Errorf("stderr does not say the run was interrupted:\n%s", stderr.String())
			}
			waitSelectedGone(t, c, ns, managed, 30*time.Second)
			if mode == "changeset" {
				out, err := launcherIn(t, kubeconfig, ws, home, "changes", "--json").CombinedOutput()
				if err != nil || strings.TrimSpace(string(out)) != "[]" {
					t.Errorf("changes after an interrupted run: %v %s, want none", err, out)
				}
			}
		})
	}
}

// waitSandboxRunning waits, bounded, until the container of a sandbox
// other than those of except runs in the namespace, and returns the
// sandbox's name; a launcher that ends first (done) fails the test.
func waitSandboxRunning(t *testing.T, c *kubeapi.Client, ns string, done chan error, limit time.Duration, except ...string) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		raw, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods", map[string][]string{"labelSelector": {managed}}, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var pods struct {
			Items []struct {
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
				Status struct {
					ContainerStatuses []struct {
						Name  string `json:"name"`
						State struct {
							Running *struct{} `json:"running"`
						} `json:"state"`
					} `json:"containerStatuses"`
				} `json:"status"`
			} `json:"items"`
		}
		if err := json.Unmarshal(raw, &pods); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Name == "sandbox" && cs.State.Running != nil && !slices.Contains(except, p.Metadata.Name) {
					return p.Metadata.Name
				}
			}
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the launcher ended before its sandbox ran: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sandbox ran in namespace %s within %v", ns, limit)
		}
		time.Sleep(250 * time.Millisecond) // the kubelet's progress, not an event here
	}
}

// TestKubeGC: a launcher killed outright (SIGKILL) leaves its sandbox on the
// cluster, which `ls --engine kubernetes` shows with its launcher gone;
// `gc --engine kubernetes` removes it, and leaves alone the sandbox of a
// launcher that still runs.
func TestKubeGC(t *testing.T) {
	c, kubeconfig := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ws := kubeWorkspace(t, "kubegc")
	prof := smallProfile(t, "offline", "")
	start := func() (*exec.Cmd, chan error, *bytes.Buffer) {
		cmd := launcherOn(t, kubeconfig, ws, "run", "--engine", "kubernetes", "-n", ns, "-p", prof, "--", "sleep", "600")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = io.Discard, &stderr
		done := startLauncher(t, cmd)
		return cmd, done, &stderr
	}
	killed, killedDone, _ := start()
	name := waitSandboxRunning(t, c, ns, killedDone, 2*time.Minute)
	if err := killed.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killedDone <- <-killedDone // ended; kept for the cleanup
	if left := count(t, c, ns, name); left["Pod"] != 1 || left["NetworkPolicy"] != 1 {
		t.Fatalf("the killed launcher's sandbox %s has %v, want its pod and its policy left", name, left)
	}

	live, liveDone, _ := start()
	liveName := waitSandboxRunning(t, c, ns, liveDone, 2*time.Minute, name)

	// ls shows both, the killed launcher's as gone.
	lsOut, err := launcherOn(t, kubeconfig, ws, "ls", "--json", "--engine", "kubernetes", "-n", ns).Output()
	if err != nil {
		t.Fatalf("ls: %v", err)
	}
	var listed []struct {
		Project   string `json:"project"`
		Workspace string `json:"workspace"`
		Alive     bool   `json:"launcher_alive"`
		State     string `json:"state"`
	}
	if err := json.Unmarshal(lsOut, &listed); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, lsOut)
	}
	alive := map[string]bool{}
	for _, l := range listed {
		alive[l.Project] = l.Alive
		if l.Workspace != ws || l.State != "running" {
			t.Errorf("ls: %+v, want workspace %s, running", l, ws)
		}
	}
	if len(listed) != 2 || alive[name] || !alive[liveName] {
		t.Errorf("ls: %s, want %s gone and %s alive", lsOut, name, liveName)
	}

	gc := launcherOn(t, kubeconfig, ws, "gc", "--engine", "kubernetes", "-n", ns)
	out, err := gc.CombinedOutput()
	if err != nil {
		t.Fatalf("gc: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "removed "+name+"\n") || strings.Contains(string(out), liveName) {
		t.Errorf("gc said %q, want it to remove %s alone", out, name)
	}
	waitGone(t, c, ns, name, 30*time.Second)
	if left := count(t, c, ns, liveName); left["Pod"] != 1 {
		t.Errorf("gc touched the live launcher's sandbox %s: it has %v", liveName, left)
	}

	if err := live.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-liveDone:
		liveDone <- err
	case <-time.After(time.Minute):
		t.Fatal("the live launcher did not end within a minute of SIGTERM")
	}
	waitSelectedGone(t, c, ns, managed, 30*time.Second)
}

// TestKubeLaunchChangeset: `run --engine kubernetes --changeset` brings
// what the sandbox wrote back as a changeset, which diff shows and apply
// applies; a hidden file read empty and a readonly path refused writes
// inside, and neither is part of the changeset.
func TestKubeLaunchChangeset(t *testing.T) {
	c, kubeconfig := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ws := kubeWorkspace(t, "kubechangeset")
	for f, content := range map[string]string{".env": "SECRET=kube-hidden-value", "src/ro.txt": "read only"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(ws, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, f), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	prof := smallProfile(t, "offline", "workspace: {readonly: [src], hide: [.env]}\n")
	home := t.TempDir()
	script := `echo changed > hello.txt; echo added > new.txt; echo "env:[$(cat .env)]"
echo x > .env 2>/dev/null || echo hide-held; echo y > src/ro.txt 2>/dev/null || echo ro-held; rm -f src/ro.txt 2>/dev/null || echo rm-held`
	cmd := launcherIn(t, kubeconfig, ws, home, "run", "--engine", "kubernetes", "--changeset", "-n", ns, "-p", prof, "--", "bash", "-c", script)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := runBounded(t, cmd, 3*time.Minute); err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{"env:[]\n", "hide-held\n", "ro-held\n", "rm-held\n"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the sandbox's output %q lacks %q", stdout.String(), want)
		}
	}
	if !strings.Contains(stderr.String(), "changeset ") || !strings.Contains(stderr.String(), "(2 changes, copy)") {
		t.Errorf("run's stderr does not name a changeset of 2 changes:\n%s", stderr.String())
	}
	waitSelectedGone(t, c, ns, managed, 30*time.Second)
	if b, _ := os.ReadFile(filepath.Join(ws, "hello.txt")); string(b) != "from the workspace" {
		t.Errorf("the workspace changed before apply: hello.txt is %q", b)
	}

	diff := launcherIn(t, kubeconfig, ws, home, "diff", "--stat")
	out, err := diff.CombinedOutput()
	if err != nil {
		t.Fatalf("diff: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "hello.txt") || !strings.Contains(string(out), "new.txt") || strings.Contains(string(out), ".env") || strings.Contains(string(out), "ro.txt") {
		t.Errorf("diff --stat: %s, want hello.txt and new.txt alone", out)
	}
	apply := launcherIn(t, kubeconfig, ws, home, "apply")
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	for f, want := range map[string]string{"hello.txt": "changed\n", "new.txt": "added\n", ".env": "SECRET=kube-hidden-value", "src/ro.txt": "read only"} {
		if b, err := os.ReadFile(filepath.Join(ws, f)); err != nil || string(b) != want {
			t.Errorf("after apply %s is %q (%v), want %q", f, b, err, want)
		}
	}
}

// runBounded runs cmd, killing it after limit (the test then fails, with
// what it said on its stderr when that is a buffer).
func runBounded(t *testing.T, cmd *exec.Cmd, limit time.Duration) error {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		said := ""
		if e, ok := cmd.Stderr.(fmt.Stringer); ok {
			said = "\nstderr:\n" + e.String()
		}
		t.Fatalf("%s did not end within %v%s", strings.Join(cmd.Args, " "), limit, said)
		return nil
	}
}

// TestKubeDoctor: `doctor --engine kubernetes` passes the cluster's checks
// here and probes the CNI: kube-router enforces NetworkPolicy, so the probe
// sees the Pod under a deny-all policy kept from the other Pod (which one
// without a policy reached), and doctor warns of nothing; the probe's Pods
// and policy are gone after.
func TestKubeDoctor(t *testing.T) {
	c, kubeconfig := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ws := kubeWorkspace(t, "kubedoctor")
	cmd := launcherOn(t, kubeconfig, ws, "doctor", "--json", "--engine", "kubernetes", "-n", ns, "-p", smallProfile(t, "offline", ""))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := runBounded(t, cmd, 3*time.Minute); err != nil {
		t.Fatalf("doctor: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("doctor with the probe: %v", time.Since(start))
	var rep struct {
		OK     bool `json:"ok"`
		Checks []struct {
			Name   string `json:"name"`
			OK     bool   `json:"ok"`
			Reason string `json:"reason"`
		} `json:"checks"`
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, stdout.String())
	}
	passed := []string{}
	for _, ch := range rep.Checks {
		if ch.OK {
			passed = append(passed, ch.Name)
		}
		if ch.Name == "network-policy" && !strings.Contains(ch.Reason, "could not reach another Pod") {
			t.Errorf("the probe says %q, want the policy seen enforced", ch.Reason)
		}
	}
	if !rep.OK || !slices.Contains(passed, "cluster") || !slices.Contains(passed, "network-policy") {
		t.Errorf("doctor: ok %v, checks passed %v, want the cluster's and the probe's among them", rep.OK, passed)
	}
	for _, w := range rep.Warnings {
		if strings.Contains(w, "NetworkPolicy") {
			t.Errorf("doctor warns %q on a cluster whose CNI enforces NetworkPolicy", w)
		}
	}
	waitSelectedGone(t, c, ns, managed, 30*time.Second)
}

// TestKubeLaunchEnds: a run the cluster cannot take (its image on no
// node) fails the preflight check "cluster" (exit 3) and makes nothing; a
// run past the profile's timeout ends with 124 and leaves nothing.
func TestKubeLaunchEnds(t *testing.T) {
	c, kubeconfig := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ws := kubeWorkspace(t, "kubeends")

	cmd := launcherOn(t, kubeconfig, ws, "run", "--engine", "kubernetes", "-n", ns, "-p", smallProfile(t, "offline", "image: propio.test/nowhere:1\n"), "--", "true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := runBounded(t, cmd, time.Minute)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(stderr.String(), "preflight check cluster failed: no node has the image propio.test/nowhere:1") {
		t.Errorf("a run of an image no node has: %v, want exit status 3 naming the image\nstderr:\n%s", err, stderr.String())
	}
	if left := countSelected(t, c, ns, managed); len(left) > 0 {
		t.Errorf("a refused run left %v", left)
	}

	stderr.Reset()
	timeout := launcherOn(t, kubeconfig, ws, "run", "--engine", "kubernetes", "-n", ns, "-p", timeoutProfile(t), "--", "sleep", "600")
	timeout.Stderr = &stderr
	start := time.Now()
	err = runBounded(t, timeout, 2*time.Minute)
	if !errors.As(err, &exit) || exit.ExitCode() != 124 || !strings.Contains(stderr.String(), "ran out of time") {
		t.Errorf("a run past its timeout: %v, want exit status 124 saying so\nstderr:\n%s", err, stderr.String())
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("a run with a 6 s timeout took %v", d)
	}
	waitSelectedGone(t, c, ns, managed, 30*time.Second)
}

// timeoutProfile is a small profile of network open with a timeout of 6 s.
func timeoutProfile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "timeout.yaml")
	if err := os.WriteFile(p, []byte("version: 1\nextends: open\nresources: {cpus: 0.5, memory: 512m, timeout: 6s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// terminate sends the launcher cmd SIGTERM and has it end within a minute
// with exit status 143 (its Wait's outcome comes on done, and is put back
// there for the test's cleanup).
func terminate(t *testing.T, cmd *exec.Cmd, done chan error, stderr fmt.Stringer) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 128+15 {
			t.Errorf("run after SIGTERM: %v, want exit status 143\nstderr:\n%s", err, stderr)
		}
	case <-time.After(time.Minute):
		t.Fatalf("run did not end within a minute of SIGTERM\nstderr:\n%s", stderr)
	}
}

// startLauncher starts the launcher cmd; its Wait's outcome comes on the
// channel returned, and a launcher still running when the test ends is
// killed.
func startLauncher(t *testing.T, cmd *exec.Cmd) chan error {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	return done
}
