// Package engine is the only package that talks to a container engine. It
// runs a generated Compose project through the Docker Compose Go SDK, in
// process: only an engine socket is needed, no compose plugin or docker CLI.
// *Engine is the backend.Runtime of Docker and Podman: the steps of a run
// (create, run, kill, remove, copy, plan the disk cap) and the facts that
// tell the two apart; the run's lifecycle over them is internal/sandbox's.
//
// It never reads profiles and never prints: errors are returned, wrapping the
// sentinels below so that the command line can add what to do about them.
package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/docker/cli/cli/command"
	"github.com/docker/cli/cli/context/docker"
	"github.com/docker/cli/cli/flags"
	"github.com/docker/compose/v5/pkg/api"
	"github.com/docker/compose/v5/pkg/compose"
	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/sirupsen/logrus"
)

// MinAPIVersion is the oldest engine API propio-sandbox runs on: Docker Engine 20.10.
const MinAPIVersion = "1.41"

// DefaultHost is where the engine listens when DOCKER_HOST is not set.
const DefaultHost = "unix:///var/run/docker.sock"

// Sentinels a caller can branch on.
var (
	ErrEngineMissing    = errors.New("no container engine found")
	ErrEngineNotRunning = errors.New("the container engine is not running")
	ErrPermission       = errors.New("permission denied on the engine socket")
	ErrEngineTooOld     = errors.New("the container engine is too old")
	// ErrSubnetTaken: the sandbox network's subnet was taken by another
	// network between choosing it and creating it.
	ErrSubnetTaken = backend.ErrSubnetTaken
)

// Streams are the launcher's terminal or pipes.
type Streams struct {
	In       io.ReadCloser
	Out, Err io.Writer
}

// Engine is a connection to one engine, with a Compose service on it.
type Engine struct {
	Host string
	// Context is the Docker context Host is that of ("" for none), and
	// ContextFrom what chose it (see Location).
	Context, ContextFrom string
	// Kind is Docker or Podman, as the engine itself says.
	Kind string
	// Rootless: a Podman running as an unprivileged user.
	Rootless bool
	// FreshInfo: Info asks the engine, even when the engine process has
	// not changed since it was last asked (doctor).
	FreshInfo bool

	cli     *command.DockerCli
	api     *apiClient
	compose api.Compose

	// identity names the engine's process, when it runs on this host
	// (infocache.go); "" when it cannot be named.
	identity string

	infoMu       sync.Mutex
	info         *Info               // the last Info read
	imageVolumes map[string][]string // the VOLUME paths of images looked up
}

// HostFromEnv returns the engine address: $DOCKER_HOST, else the default socket.
func HostFromEnv() string {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return h
	}
	return DefaultHost
}

// The Compose SDK and the docker CLI's code log what they also return (a
// wait that failed, as exit status 125), through logrus, straight to the
// process's stderr: the launch says what went wrong, from their errors.
func init() { logrus.SetOutput(io.Discard) }

// Connect reaches the engine at host and checks that it can run sandboxes.
// Its errors wrap ErrEngineMissing, ErrEngineNotRunning, ErrPermission or
// ErrEngineTooOld when that is what went wrong.
//
// A host that is not a unix socket and that a Docker context of the docker
// CLI's configuration ($DOCKER_CONFIG) has as its endpoint is reached as
// that context says (its TLS material, ssh), unless DOCKER_CERT_PATH says
// how: a process carrying on a launch's work is given its host alone.
func Connect(ctx context.Context, host string, s Streams) (*Engine, error) {
	loc := Location{Host: host}
	if os.Getenv("DOCKER_CERT_PATH") == "" {
		if ep, ok := contextOf(configDir(os.Getenv), host); ok {
			loc = ep.location()
		}
	}
	return ConnectTo(ctx, loc, s)
}

// ConnectTo is Connect to the engine Locate found, through its context's
// endpoint (TLS, ssh) when it has one.
func ConnectTo(ctx context.Context, loc Location, s Streams) (*Engine, error) {
	host := loc.Host
	kind, known, apiVersion, identity := "", false, "", ""
	if path, ok := strings.CutPrefix(host, "unix://"); ok {
		h, err := probeSocket(ctx, path)
		if err != nil {
			return nil, err
		}
		kind, known = kindOf(h)
		apiVersion = h.Get("Api-Version")
		identity = daemonIdentity(path)
	}
	opts := []client.Opt{client.FromEnv, client.WithHost(host)}
	if loc.opts != nil {
		// A context's endpoint: its own host and TLS, not DOCKER_CERT_PATH's.
		opts = loc.opts
	} else if strings.HasPrefix(host, "ssh://") {
		// DOCKER_HOST=ssh://...: through ssh, as the docker CLI goes
		// (`ssh ... docker system dial-stdio` on the engine's host).
		ep := docker.Endpoint{EndpointMeta: docker.EndpointMeta{Host: host}}
		var err error
		if opts, err = ep.ClientOpts(); err != nil {
			return nil, fmt.Errorf("connecting to %s: %w", host, err)
		}
	}
	if apiVersion != "" {
		// Known from the socket's ping: no second one to negotiate it.
		opts = append(opts, client.WithAPIVersion(lowerVersion(apiVersion, client.MaxAPIVersion)))
	}
	base, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", host, err)
	}
	api := &apiClient{APIClient: base}
	cliOpts := []command.CLIOption{command.WithAPIClient(api), command.WithOutputStream(s.Out), command.WithErrorStream(s.Err)}
	if s.In != nil {
		cliOpts = append(cliOpts, command.WithInputStream(s.In))
	}
	cli, err := command.NewDockerCli(cliOpts...)
	if err != nil {
		return nil, fmt.Errorf("setting up the engine client: %w", err)
	}
	if err := cli.Initialize(&flags.ClientOptions{Hosts: []string{host}}); err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", host, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if apiVersion == "" { // the socket's ping did not say, or there was none
		ping, err := cli.Client().Ping(pctx, client.PingOptions{})
		if err != nil {
			return nil, classify(host, err)
		}
		apiVersion = ping.APIVersion
	}
	if apiVersion != "" && backend.VersionLess(apiVersion, MinAPIVersion) {
		return nil, fmt.Errorf("engine at %s speaks API %s, propio-sandbox needs %s (Docker Engine 20.10) or newer: %w", host, apiVersion, MinAPIVersion, ErrEngineTooOld)
	}
	// The service takes its streams from the CLI, which keeps stdin the
	// terminal it is: compose.WithStreams would wrap it, and the SDK would
	// then refuse a TTY ("stdin is not a terminal").
	svc, err := compose.NewComposeService(cli)
	if err != nil {
		return nil, fmt.Errorf("setting up compose: %w", err)
	}
	// The SDK pings the engine once, to learn the API version it speaks,
	// as it first creates a container: here, as the launch connects (while
	// it reads its profile), not as it creates the sandbox.
	if v, ok := svc.(interface {
		RuntimeAPIVersion(context.Context) (string, error)
	}); ok {
		if _, err := v.RuntimeAPIVersion(ctx); err != nil {
			return nil, classify(host, err)
		}
	}
	e := &Engine{Host: host, Context: loc.Context, ContextFrom: loc.ContextFrom, Kind: Docker, cli: cli, api: api, compose: svc, identity: identity}
	if known {
		e.Kind = kind
	} else if err := e.identify(pctx); err != nil {
		return nil, err
	}
	if e.Kind == Podman {
		// The compatible /info does not say whether Podman is rootless; its
		// own does.
		if e.Rootless, err = podmanRootless(pctx, e.Host); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// identify tells Podman from Docker by the components the engine reports
// (its version's answer), when the headers of its ping did not say.
func (e *Engine) identify(ctx context.Context) error {
	v, err := e.cli.Client().ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		return fmt.Errorf("reading the engine's version: %w", err)
	}
	for _, c := range v.Components {
		if strings.Contains(c.Name, "Podman") {
			e.Kind = Podman
		}
	}
	return nil
}

// podmanRootless asks Podman's own info endpoint whether it runs rootless.
func podmanRootless(ctx context.Context, host string) (bool, error) {
	hc, base := podmanAPI(host)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v4.0.0/libpod/info", nil)
	if err != nil {
		return false, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, fmt.Errorf("reading Podman's info: %w", err)
	}
	defer resp.Body.Close()
	var info struct {
		Host struct {
			Security struct {
				Rootless bool `json:"rootless"`
			} `json:"security"`
		} `json:"host"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return false, fmt.Errorf("reading Podman's info: %w", err)
	}
	return info.Host.Security.Rootless, nil
}

// podmanAPI is a client of Podman's own API (libpod) at host, and the
// address its paths go after.
func podmanAPI(host string) (*http.Client, string) {
	hc := &http.Client{Timeout: 10 * time.Second}
	base := "http://d"
	if sock, ok := strings.CutPrefix(host, "unix://"); ok {
		hc.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
	} else {
		base = "http://" + strings.TrimPrefix(strings.TrimPrefix(host, "tcp://"), "http://")
	}
	return hc, base
}

// Close releases the connection.
func (e *Engine) Close() error { return e.cli.Client().Close() }

// probeSocket tells a missing engine from a stopped one and from a socket the
// user may not open, before any client library turns those into one message;
// it returns the headers of the engine's ping, which may say what it is.
func probeSocket(ctx context.Context, path string) (http.Header, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if installed() {
			return nil, fmt.Errorf("no engine socket at %s, though Docker is installed: %w", path, ErrEngineNotRunning)
		}
		return nil, fmt.Errorf("no engine socket at %s and no Docker installed: %w", path, ErrEngineMissing)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h, err := freshPing(ctx, "unix://"+path)
	if err != nil {
		return nil, classify("unix://"+path, err)
	}
	return h, nil
}

// installed reports whether a Docker engine or CLI is on this machine.
func installed() bool {
	for _, name := range []string{"dockerd", "docker"} {
		if _, err := exec.LookPath(name); err == nil {
			return true
		}
	}
	return false
}

func classify(host string, err error) error {
	switch {
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) || strings.Contains(err.Error(), "permission denied"):
		return fmt.Errorf("connecting to %s: %w", host, ErrPermission)
	case errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) || strings.Contains(err.Error(), "connection refused"):
		return fmt.Errorf("connecting to %s: nothing is listening: %w", host, ErrEngineNotRunning)
	case strings.Contains(err.Error(), "API version") && strings.Contains(err.Error(), "not supported"):
		return fmt.Errorf("engine at %s: %v: %w", host, err, ErrEngineTooOld)
	}
	return fmt.Errorf("connecting to %s: %w", host, err)
}

// lowerVersion is the lower of two API versions.
func lowerVersion(a, b string) string {
	if backend.VersionLess(b, a) {
		return b
	}
	return a
}
