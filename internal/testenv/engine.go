package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Engine is a container engine of a test's own, which the test may stop,
// kill and start again without touching the engine other tests share: a
// dockerd with its own data root, exec root, socket and network namespace
// (PrivateDocker), or a `podman system service` on a socket of its own
// (PrivatePodman; its containers and images are the host's Podman's, and
// keep running under conmon while the service is stopped, as they do when
// a user's service stops).
//
// A test points the launcher at it with DOCKER_HOST=e.Host, and observes
// it with e.Docker.
type Engine struct {
	// Host is where it listens: unix:///.../docker.sock.
	Host string
	// Kind is "docker" or "podman".
	Kind string

	tb    testing.TB
	dir   string
	sock  string
	netns string // the network namespace dockerd runs in, under /run/netns
	args  []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// engineUp bounds the wait for a private engine to answer.
const engineUp = time.Minute

// PrivateDocker starts a dockerd of the test's own (root only): its data
// root, exec root and socket in a directory of the test, in a network
// namespace of its own (so its bridges and iptables rules are its own), with
// the images named loaded into it from the tests' engine. It is stopped, and
// all it made removed, when the test ends. Without root, dockerd, ip or
// nsenter, the test is skipped with the reason, or failed under
// PROPIO_E2E=require.
func PrivateDocker(tb testing.TB, images ...string) *Engine {
	tb.Helper()
	return privateDocker(tb, nil, images)
}

// privateDocker is PrivateDocker with more arguments for dockerd.
func privateDocker(tb testing.TB, more []string, images []string) *Engine {
	tb.Helper()
	if reason := privateDockerMissing(); reason != "" {
		skipOrFail(tb, "a private Docker engine: "+reason)
	}
	dir, err := os.MkdirTemp("", "propio-engine-") // short: the socket's path is limited
	if err != nil {
		tb.Fatal(err)
	}
	e := &Engine{Kind: "docker", tb: tb, dir: dir, sock: filepath.Join(dir, "docker.sock"), netns: "propio-test-" + filepath.Base(dir)[len("propio-engine-"):]}
	e.Host = "unix://" + e.sock
	tb.Cleanup(e.remove)
	if out, err := exec.Command("ip", "netns", "add", e.netns).CombinedOutput(); err != nil {
		tb.Fatalf("making the private engine's network namespace: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "netns", "exec", e.netns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		tb.Fatalf("bringing up loopback in %s: %v: %s", e.netns, err, out)
	}
	// nsenter enters the network namespace alone: `ip netns exec` would also
	// mount a /sys of its own, without the cgroup hierarchies dockerd needs.
	e.args = []string{"nsenter", "--net=/run/netns/" + e.netns, "--", "dockerd",
		"--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "dockerd.pid"), "--host", e.Host, "--log-level", "warn",
		// Its containers' cgroups apart from the shared engine's, so that
		// what a killed dockerd leaves running can be found.
		"--cgroup-parent", "/" + e.netns}
	e.args = append(e.args, more...)
	e.Start()
	for _, image := range images {
		e.load(image)
	}
	return e
}

// PrivatePodman starts a `podman system service` of the test's own, on a
// socket of its own, over the host's Podman (its containers and images).
// It is stopped when the test ends; what the test made on it is the
// test's to remove. Without podman, the test is skipped with the reason, or
// failed under PROPIO_E2E=require.
func PrivatePodman(tb testing.TB) *Engine {
	tb.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		skipOrFail(tb, "a private Podman service: podman is not installed (e2e/podman-setup.sh installs it)")
	}
	dir, err := os.MkdirTemp("", "propio-engine-")
	if err != nil {
		tb.Fatal(err)
	}
	e := &Engine{Kind: "podman", tb: tb, dir: dir, sock: filepath.Join(dir, "podman.sock")}
	e.Host = "unix://" + e.sock
	tb.Cleanup(e.remove)
	e.args = []string{"podman", "system", "service", "--time=0", e.Host}
	e.Start()
	return e
}

// privateDockerMissing says what a private dockerd needs and this machine
// lacks, or "".
func privateDockerMissing() string {
	if os.Geteuid() != 0 {
		return "needs root (a dockerd and a network namespace)"
	}
	for _, tool := range []string{"dockerd", "ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is not installed"
		}
	}
	return ""
}

func skipOrFail(tb testing.TB, reason string) {
	tb.Helper()
	if os.Getenv("PROPIO_E2E") == "require" {
		tb.Fatalf("PROPIO_E2E=require, but %s", reason)
	}
	tb.Skipf("skipping: %s; set PROPIO_E2E=require to fail instead", reason)
}

// Start starts the engine (again, after Stop or Kill, with what it kept)
// and waits until it answers.
func (e *Engine) Start() {
	e.tb.Helper()
	if err := e.start(); err != nil {
		e.tb.Fatal(err)
	}
}

func (e *Engine) start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cmd != nil {
		return fmt.Errorf("the private %s engine runs already", e.Kind)
	}
	// A killed dockerd's containerd runs on, holding its socket: it goes
	// (its shims, and the containers, stay for the new one to find).
	e.killPidfile(filepath.Join(e.dir, "exec", "containerd", "containerd.pid"))
	logf, err := os.OpenFile(filepath.Join(e.dir, e.Kind+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(e.args[0], e.args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/" // conmon leaves files in its working directory
	// Its own process group: a signal for the test is not for the engine.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the private %s engine: %v", e.Kind, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	e.cmd, e.exited = cmd, exited
	deadline := time.After(engineUp)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !e.answers() {
		select {
		case <-exited:
			e.cmd = nil
			return fmt.Errorf("the private %s engine exited at once:\n%s", e.Kind, e.logTail())
		case <-deadline:
			return fmt.Errorf("the private %s engine did not answer within %s:\n%s", e.Kind, engineUp, e.logTail())
		case <-tick.C:
		}
	}
	return nil
}

// Stop stops the engine as its service manager would (SIGTERM: dockerd
// stops its containers first) and waits until it has exited.
func (e *Engine) Stop() { e.end(syscall.SIGTERM) }

// Kill kills the engine's process at once (SIGKILL), as a crash would; its
// containers' processes stay.
func (e *Engine) Kill() { e.end(syscall.SIGKILL) }

func (e *Engine) end(sig syscall.Signal) {
	e.tb.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cmd == nil {
		return
	}
	e.cmd.Process.Signal(sig)
	select {
	case <-e.exited:
	case <-time.After(2 * time.Minute):
		e.cmd.Process.Kill()
		<-e.exited
		e.tb.Errorf("the private %s engine did not exit within 2 minutes of %v; killed", e.Kind, sig)
	}
	e.cmd = nil
	if e.Kind == "podman" {
		os.Remove(e.sock)
	}
}

// Running reports whether the engine's process runs.
func (e *Engine) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cmd != nil
}

// Docker runs the docker CLI against the engine, bounded by five minutes.
func (e *Engine) Docker(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = append(os.Environ(), "DOCKER_HOST="+e.Host)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker -H %s %s: %v: %s", e.Host, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// load copies image from the tests' engine into this one.
func (e *Engine) load(image string) {
	e.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	save := exec.CommandContext(ctx, "docker", "save", image)
	load := exec.CommandContext(ctx, "docker", "load", "-q")
	load.Env = append(os.Environ(), "DOCKER_HOST="+e.Host)
	pipe, err := save.StdoutPipe()
	if err != nil {
		e.tb.Fatal(err)
	}
	load.Stdin = pipe
	var saveErr strings.Builder
	save.Stderr = &saveErr
	if err := save.Start(); err != nil {
		e.tb.Fatalf("docker save %s: %v", image, err)
	}
	out, lerr := load.CombinedOutput()
	serr := save.Wait()
	if serr != nil || lerr != nil {
		e.tb.Fatalf("copying %s into the private engine: save: %v %s; load: %v %s", image, serr, saveErr.String(), lerr, out)
	}
}

// answers reports whether the engine answers a ping.
func (e *Engine) answers() bool {
	hc := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", e.sock)
	}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://d/_ping")
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// remove stops the engine and removes all it made: for a private dockerd,
// its containers (started again when it was stopped, so that it removes
// them itself), its processes, mounts, network namespace and directory.
func (e *Engine) remove() {
	if e.Kind == "docker" && e.netns != "" && e.args != nil {
		if !e.Running() {
			if err := e.start(); err != nil {
				e.tb.Logf("starting the private engine again to remove its containers: %v", err)
			}
		}
		if e.Running() {
			if ids, _ := e.Docker("ps", "-aq"); strings.TrimSpace(ids) != "" {
				e.Docker(append([]string{"rm", "-f"}, strings.Fields(ids)...)...)
			}
		}
	}
	e.Stop()
	if e.netns != "" {
		// What the engine left running (a killed dockerd's containers,
		// containerd and shims) goes with it.
		killCgroups(e.netns)
		if out, err := exec.Command("ip", "netns", "pids", e.netns).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		unmountBelow(e.dir)
		exec.Command("ip", "netns", "del", e.netns).Run()
	}
	unmountBelow(e.dir)
	if err := os.RemoveAll(e.dir); err != nil {
		e.tb.Errorf("removing the private engine's directory: %v", err)
	}
}

// killPidfile kills the process whose pid the file holds, if it runs, and
// waits (bounded) until it is gone.
func (e *Engine) killPidfile(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || syscall.Kill(pid, syscall.SIGKILL) != nil {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // a process that is not our child cannot be waited for
	}
}

// killCgroups kills every process in the cgroups named name at the top of
// each hierarchy (a private dockerd's --cgroup-parent), and removes them.
func killCgroups(name string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + name)
	if top := "/sys/fs/cgroup/" + name; dirExists(top) {
		roots = append(roots, top) // cgroup v2
	}
	for _, root := range roots {
		var dirs []string
		filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for _, dir := range dirs {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			for range 100 { // a killed process leaves its cgroup a moment later
				if err := os.Remove(dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}

func dirExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// logTail is the end of the engine's log.
func (e *Engine) logTail() string {
	b, err := os.ReadFile(filepath.Join(e.dir, e.Kind+".log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// unmountBelow detaches every mount at or below dir, deepest first.
func unmountBelow(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			continue
		}
	}
}
