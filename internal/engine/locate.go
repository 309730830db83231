package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/client"
)

// Engine kinds, as a profile's engine field and --engine name them.
const (
	Auto   = "auto"
	Docker = "docker"
	Podman = "podman"
)

// Location is where the engine of a launch listens.
type Location struct {
	Host string // unix:///... (or what DOCKER_HOST or a context says)
	Kind string // Docker or Podman: asked for, or found
	// Context is the Docker context the host is that of; "" for none (the
	// default context). ContextFrom says what chose it: --context,
	// DOCKER_CONTEXT, or the config file that names it current.
	Context, ContextFrom string
	// Stop ends the `podman system service` started for this launch; nil
	// when none was started.
	Stop func() error
	// opts reach a context's endpoint that a host alone does not (TLS,
	// ssh).
	opts []client.Opt
}

// serviceTimeout bounds the wait for a Podman API service to answer.
const serviceTimeout = 15 * time.Second

// Locate finds the engine: want is Docker, Podman or Auto (or empty), or a
// Docker context's name after WithContext.
//
//   - docker: as the docker CLI chooses (see resolveDocker): DOCKER_HOST,
//     else DOCKER_CONTEXT, else the current context of the docker CLI's
//     config file, else the default socket.
//   - a context (--context): that context's endpoint, whatever DOCKER_HOST
//     says, as the docker CLI's --context does.
//   - podman: CONTAINER_HOST (when it is unix://), else Podman's socket
//     (/run/podman/podman.sock as root, $XDG_RUNTIME_DIR/podman/podman.sock
//     otherwise); when nothing listens there and podman is installed, a
//     `podman system service` is started for the launch, on a socket of its
//     own, and Stop ends it.
//   - auto: what docker chooses when DOCKER_HOST or a context names it;
//     else Docker's socket when something listens on it; else Podman's, as
//     above, when podman is installed; else Docker's default (whose absence
//     Connect explains).
func Locate(ctx context.Context, want string, getenv func(string) string) (Location, error) {
	if name, ok := strings.CutPrefix(want, contextPrefix); ok {
		if name == "" {
			return Location{}, errors.New("--context names no context")
		}
		ep, _, err := resolveDocker(name, getenv)
		if err != nil {
			return Location{}, err
		}
		return ep.location(), nil
	}
	switch want {
	case "", Auto:
		ep, found, err := resolveDocker("", getenv)
		if err != nil {
			return Location{}, err
		}
		if found {
			return ep.location(), nil
		}
		if listening(strings.TrimPrefix(DefaultHost, "unix://")) {
			return Location{Host: DefaultHost, Kind: Docker}, nil
		}
		if _, err := exec.LookPath("podman"); err == nil {
			return locatePodman(ctx, getenv)
		}
		return Location{Host: DefaultHost, Kind: Docker}, nil
	case Docker:
		ep, _, err := resolveDocker("", getenv)
		if err != nil {
			return Location{}, err
		}
		return ep.location(), nil
	case Podman:
		return locatePodman(ctx, getenv)
	}
	return Location{}, fmt.Errorf("engine %q: want auto, docker or podman", want)
}

func (ep dockerEndpoint) location() Location {
	return Location{Host: ep.Host, Kind: Docker, Context: ep.Context, ContextFrom: ep.From, opts: ep.opts}
}

// Sockets lists the paths where an engine's API socket is, or may be, for
// this user: DOCKER_HOST's and CONTAINER_HOST's when they name a unix
// socket, then Docker's, those of the docker CLI's contexts, rootless Docker's, Podman's (rootful and rootless),
// containerd's, and those of Docker Desktop, Colima and Rancher Desktop in
// home. A sandbox given any of them controls the engine, and so the host.
// The socket a launch actually reached is not always among them (a Podman
// service started for the launch): run adds it.
func Sockets(getenv func(string) string, home string) []string {
	var out []string
	add := func(path string) {
		if path != "" && filepath.IsAbs(path) && !slices.Contains(out, filepath.Clean(path)) {
			out = append(out, filepath.Clean(path))
		}
	}
	for _, v := range []string{"DOCKER_HOST", "CONTAINER_HOST"} {
		if path, ok := strings.CutPrefix(getenv(v), "unix://"); ok {
			add(path)
		}
	}
	add(strings.TrimPrefix(DefaultHost, "unix://"))
	for _, h := range contextHosts(configDir(getenv)) {
		if path, ok := strings.CutPrefix(h, "unix://"); ok {
			add(path)
		}
	}
	add("/var/run/docker.sock")
	add("/run/docker.sock")
	if dir := getenv("XDG_RUNTIME_DIR"); dir != "" {
		add(filepath.Join(dir, "docker.sock"))
		add(filepath.Join(dir, "podman", "podman.sock"))
	}
	add("/run/podman/podman.sock")
	add(PodmanSocket(getenv))
	add("/run/containerd/containerd.sock")
	if home != "" {
		for _, f := range []string{".docker/run/docker.sock", ".docker/desktop/docker.sock", ".colima/default/docker.sock", ".rd/docker.sock"} {
			add(filepath.Join(home, f))
		}
	}
	return out
}

// PodmanSocket is where Podman's API service listens by default for the
// current user.
func PodmanSocket(getenv func(string) string) string {
	if os.Geteuid() == 0 {
		return "/run/podman/podman.sock"
	}
	if dir := getenv("XDG_RUNTIME_DIR"); dir != "" {
		return filepath.Join(dir, "podman", "podman.sock")
	}
	return filepath.Join("/run/user", fmt.Sprint(os.Geteuid()), "podman", "podman.sock")
}

func locatePodman(ctx context.Context, getenv func(string) string) (Location, error) {
	if h := getenv("CONTAINER_HOST"); h != "" && !strings.HasPrefix(h, "unix://") {
		return Location{Host: h, Kind: Podman}, nil // ssh:// and tcp:// are the user's to keep up
	}
	sock, named := strings.CutPrefix(getenv("CONTAINER_HOST"), "unix://")
	if !named {
		sock = PodmanSocket(getenv)
	}
	if listening(sock) {
		return Location{Host: "unix://" + sock, Kind: Podman}, nil
	}
	if !named {
		// Not on the default path, which another launcher may be starting a
		// service on too: on one of this launch's own.
		dir := getenv("XDG_RUNTIME_DIR")
		if dir == "" {
			dir = os.TempDir()
		}
		sock = filepath.Join(dir, fmt.Sprintf("propio-sandbox-podman-%d.sock", os.Getpid()))
	}
	return startPodmanService(ctx, sock)
}

// startPodmanService runs `podman system service` on sock until Stop,
// waiting (bounded) until it answers.
func startPodmanService(ctx context.Context, sock string) (Location, error) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		return Location{}, fmt.Errorf("no Podman API service listens on %s and no podman is installed: %w", sock, ErrEngineMissing)
	}
	os.Remove(sock) // a stale socket: nothing listens on it
	cmd := exec.Command(podman, "system", "service", "--time=0", "unix://"+sock)
	// Not a client of another Podman: CONTAINER_HOST would make it one.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONTAINER_HOST=") && !strings.HasPrefix(kv, "CONTAINER_CONNECTION=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a Ctrl+C for the sandbox is not for the service
	// Not in the workspace: Podman's conmon leaves files in its working
	// directory (an "oom" file when a container is killed for memory).
	cmd.Dir = "/"
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return Location{}, fmt.Errorf("starting podman system service: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() error {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		os.Remove(sock)
		return nil
	}
	deadline := time.Now().Add(serviceTimeout)
	for !listening(sock) {
		select {
		case err := <-exited:
			exited <- err
			os.Remove(sock)
			return Location{}, fmt.Errorf("podman system service ended at once (%v): %s: %w", err, strings.TrimSpace(stderr.String()), ErrEngineNotRunning)
		case <-ctx.Done():
			stop()
			return Location{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return Location{}, fmt.Errorf("podman system service did not answer on %s within %v: %w", sock, serviceTimeout, ErrEngineNotRunning)
		}
	}
	return Location{Host: "unix://" + sock, Kind: Podman, Stop: stop}, nil
}

// listening reports whether something accepts connections on the socket.
func listening(path string) bool {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
