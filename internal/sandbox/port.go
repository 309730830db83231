package sandbox

// The port request: the agent asks for a port of its sandbox to be
// published on the host's 127.0.0.1 while the sandbox runs, in every
// network mode (the profile's ports need network: open). A relay container
// joins the sandbox's network namespace (no network of its own) and serves
// a unix socket in a directory of the user's; the launcher listens on
// 127.0.0.1 and pipes each connection to it.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/gatewayimage"
	"github.com/propio/propio-sandbox/internal/portrelay"
)

// relayDir is where a relay container sees its directory of the host.
const relayDir = "/run/propio-sandbox-relay"

// Budgets of a port request's steps.
const (
	relayReady  = 15 * time.Second // until the relay serves its socket
	relayRemove = 30 * time.Second // removing the relays when the sandbox ends
)

// Ports publishes ports of one running sandbox at the agent's request. Its
// Handle is the handler of requests of kind "port", and Check their check
// before anyone is asked; Close, when the sandbox ends, closes the
// listeners and removes the relays.
type Ports struct {
	rt      backend.Runtime
	project string
	labels  map[string]string // the sandbox's: Remove and gc find the relays by them
	user    string
	keepID  bool
	local   bool
	image   func(ctx context.Context) (string, error)
	// fixed are the ports the profile's ports publish already, to the host
	// address and port it said.
	fixed map[int]string
	// engine are the ports an engine's API listens on (enginePorts): never
	// published, lest a server of the sandbox pose as the engine.
	engine map[int]bool
	dir    string // the relays' directory on the host (0700)

	ctx    context.Context // ends with Close: the forwards stop
	cancel context.CancelFunc
	mu     sync.Mutex
	open   map[int]*published // nil while being published
	closed bool
	wg     sync.WaitGroup
}

// published is one port published: the launcher's listener and the relay.
type published struct {
	url   string
	host  int
	ln    net.Listener
	relay string
}

// Handle publishes req.Port of the sandbox on 127.0.0.1 and returns
// {"url": "http://127.0.0.1:N", "host_port": N}: the same port number when
// it is free on the host, another one otherwise. It stays published until
// the sandbox ends.
func (p *Ports) Handle(ctx context.Context, req ask.Request) (map[string]any, error) {
	port := req.Port
	if err := p.reserve(port); err != nil {
		return nil, err
	}
	pub, err := p.publish(ctx, port)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil && p.closed {
		err = errors.New("the sandbox has ended")
	}
	if err != nil {
		delete(p.open, port)
		if pub != nil {
			pub.ln.Close()
			p.removeRelay(pub.relay)
		}
		return nil, fmt.Errorf("publishing port %d: %w", port, err)
	}
	p.open[port] = pub
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		portrelay.Forward(p.ctx, pub.ln, func(ctx context.Context) (net.Conn, error) { return p.dial(ctx, port) })
	}()
	return map[string]any{"url": pub.url, "host_port": pub.host}, nil
}

// Check refuses, before anyone is asked, a request whose port cannot be
// published: not a port, or published already.
func (p *Ports) Check(req ask.Request) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refusal(req.Port)
}

// reserve checks that port can be published, and marks it as being
// published.
func (p *Ports) reserve(port int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.refusal(port); err != nil {
		return err
	}
	p.open[port] = nil
	return nil
}

// refusal says why port cannot be published, or nil; p.mu is held.
func (p *Ports) refusal(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d is not a port: want 1 to 65535", port)
	}
	if port < 1024 {
		return fmt.Errorf("port %d is privileged on the host, where a server of the sandbox would pose as the host's own: serve on a port of 1024 or above inside, and ask for that", port)
	}
	if p.engine[port] {
		return fmt.Errorf("port %d is a container engine's API port, where a server of the sandbox would pose as the engine: serve on another port inside, and ask for that", port)
	}
	switch pub, ok := p.open[port]; {
	case p.closed:
		return errors.New("the sandbox has ended")
	case p.fixed[port] != "":
		return fmt.Errorf("port %d is published already, by the profile's ports, at %s", port, p.fixed[port])
	case ok && pub == nil:
		return fmt.Errorf("port %d is being published already", port)
	case ok:
		return fmt.Errorf("port %d is published already, at %s", port, pub.url)
	}
	return nil
}

// publish starts the relay of port and the launcher's listener.
func (p *Ports) publish(ctx context.Context, port int) (*published, error) {
	if !p.local {
		return nil, errors.New("the engine does not run on this host: its relay's socket would not be this host's")
	}
	image, err := p.image(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the relays' directory: %w", err)
	}
	sock := filepath.Join(p.dir, portrelay.SocketName(port))
	os.Remove(sock) // an earlier relay's, for a port published again
	id, err := p.rt.StartRelay(ctx, backend.Relay{
		Project: p.project, Service: generator.Service,
		Image:   image,
		Command: []string{"port-relay", "--socket", relayDir + "/" + portrelay.SocketName(port), "--port", strconv.Itoa(port)},
		Dir:     p.dir, Target: relayDir,
		User: p.user, KeepID: p.keepID,
		Labels: p.labels,
	})
	if err != nil {
		return nil, err
	}
	if err := waitSocket(ctx, sock, relayReady); err != nil {
		p.removeRelay(id)
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		// Taken (or privileged) on the host: any free one.
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		p.removeRelay(id)
		return nil, fmt.Errorf("listening on 127.0.0.1: %w", err)
	}
	host := ln.Addr().(*net.TCPAddr).Port
	return &published{url: "http://127.0.0.1:" + strconv.Itoa(host), host: host, ln: ln, relay: id}, nil
}

// waitSocket waits until the relay's socket appears, within limit.
func waitSocket(ctx context.Context, sock string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Lstat(sock); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the relay did not serve its socket within %s", limit)
		case <-tick.C:
		}
	}
}

// dial connects to the relay of port, through the directory's descriptor
// when the socket's path is too long for an address.
func (p *Ports) dial(ctx context.Context, port int) (net.Conn, error) {
	return fsutil.DialUnix(ctx, p.dir, portrelay.SocketName(port))
}

func (p *Ports) removeRelay(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), relayRemove)
	defer cancel()
	p.rt.RemoveContainer(ctx, id)
}

// Close ends what Handle published: the listeners closed, the connections
// they carry ended, the relays removed, their directory too. A request
// after it is refused.
func (p *Ports) Close() error {
	p.mu.Lock()
	p.closed = true
	pubs := make([]*published, 0, len(p.open))
	for _, pub := range p.open {
		if pub != nil {
			pubs = append(pubs, pub)
		}
	}
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), relayRemove)
	defer cancel()
	for _, pub := range pubs {
		errs = append(errs, p.rt.RemoveContainer(ctx, pub.relay))
	}
	errs = append(errs, os.RemoveAll(p.dir))
	return errors.Join(errs...)
}

// newPorts is the port publisher of the sandbox project (as generated, its
// labels not yet the launcher's), for the launch's engine.
func (s *launch) newPorts(project *types.Project) *Ports {
	svc := project.Services[generator.Service]
	fixed := map[int]string{}
	for _, b := range svc.Ports {
		if b.Protocol == "" || b.Protocol == "tcp" {
			fixed[int(b.Target)] = net.JoinHostPort(b.HostIP, b.Published)
		}
	}
	user := fmt.Sprintf("%d:%d", s.plan.host.UID, s.plan.host.GID)
	if s.facts.Rootless && !s.facts.KeepID {
		user = "0:0" // a rootless engine's root is the user, who owns the directory
	}
	p := &Ports{
		rt: s.rt, project: project.Name,
		labels: withLabels(svc.Labels, launcherLabels(project.Name)),
		user:   user, keepID: s.facts.KeepID, local: s.facts.Local,
		image:  s.relayImage,
		fixed:  fixed,
		engine: enginePorts(s.host),
		dir:    filepath.Join(s.Env.Dirs.State, "ports", project.Name),
		open:   map[int]*published{},
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// relayImage is the gateway's image, made of this executable, which the
// relays run: made now unless the engine has it (quietly: the sandbox owns
// the terminal).
func (s *launch) relayImage(ctx context.Context) (string, error) {
	exe, err := gatewayBinary()
	if err != nil {
		return "", err
	}
	tag, err := gatewayimage.CachedTag(exe, filepath.Join(s.Env.Dirs.State, "gateway-image"))
	if err != nil {
		return "", gatewayError{err}
	}
	if has, err := s.rt.HasImage(ctx, tag); err != nil || has {
		return tag, err
	}
	bctx, err := gatewayimage.Context(exe)
	if err != nil {
		return "", gatewayError{err}
	}
	return tag, s.rt.BuildImage(ctx, tag, bctx)
}

// enginePorts are the ports a container engine's API listens on: Docker's
// 2375 and 2376, and the port of host (DOCKER_HOST's, as the engine was
// found) when it is a TCP address.
func enginePorts(host string) map[int]bool {
	out := map[int]bool{2375: true, 2376: true}
	u, err := url.Parse(host)
	if err != nil || u.Scheme == "unix" || u.Scheme == "npipe" {
		return out
	}
	if n, err := strconv.Atoi(u.Port()); err == nil {
		out[n] = true
	}
	return out
}
