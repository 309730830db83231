package sshagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// VMSocket is the tunnel's socket inside the podman machine for launch id.
func VMSocket(id string) string { return "/tmp/propio-sandbox-ssh-agent-" + id + ".sock" }

var validID = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

const (
	hintStart   = "start the podman machine: `podman machine start`"
	hintConns   = "check podman's connections: `podman system connection list`"
	hintMachine = "check that the podman machine is running: `podman machine list`, then `podman machine start`"
)

// connection is one entry of `podman system connection list --format json`.
// Unknown fields (ReadWrite, IsMachine...) are ignored.
type connection struct {
	Name     string
	URI      string
	Identity string
	Default  bool
}

// sshTarget is how to reach the podman machine's VM with ssh.
type sshTarget struct {
	dest     string // [user@]host
	port     string
	identity string
}

// args returns ssh's arguments: its options, then extra, then the
// destination, then the remote command. The user's ssh configuration is not
// read (-F /dev/null): it could add a ProxyCommand, a ControlMaster or a
// RemoteCommand to these connections.
func (t sshTarget) args(extra []string, remote ...string) []string {
	a := []string{"-F", "/dev/null"}
	if t.identity != "" {
		a = append(a, "-i", t.identity, "-o", "IdentitiesOnly=yes")
	}
	a = append(a, "-p", t.port,
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
		"-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR")
	a = append(a, extra...)
	a = append(a, t.dest)
	return append(a, remote...)
}

// byHand is the command that checks the connection by hand, for hints.
func (t sshTarget) byHand() string {
	s := "ssh"
	if t.identity != "" {
		s += " -i " + t.identity
	}
	return "check the connection by hand: `" + s + " -p " + t.port + " " + t.dest + " true`"
}

// podmanMachine forwards the agent into the podman machine's VM through an
// ssh reverse tunnel and returns the VM's end of it as the source.
func podmanMachine(ctx context.Context, c Config, res Result) (Result, error) {
	if !validID.MatchString(c.ID) {
		return res, fmt.Errorf("forwarding the SSH agent: Config.ID %q: want letters, digits, '.', '_' or '-'", c.ID)
	}
	conn, err := pickConnection(ctx, c.Run)
	if err != nil {
		return res, err
	}
	target, err := parseURI(conn)
	if err != nil {
		return res, err
	}
	sock := VMSocket(c.ID)
	if _, err := c.Run.Output(ctx, "ssh", target.args(nil, "rm", "-f", sock)...); err != nil {
		return res, fatal(err, fmt.Sprintf("removing a stale %s in the podman machine (connection %q)", sock, conn.Name),
			hintMachine, target.byHand())
	}
	proc, err := c.Run.Start(ctx, "ssh", target.args([]string{"-N",
		"-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes",
		"-R", sock + ":" + c.AuthSock})...)
	if err != nil {
		return res, fatal(err, "starting the ssh tunnel into the podman machine",
			"check that ssh is installed: `ssh -V`", target.byHand())
	}
	t := &tunnel{proc: proc, done: make(chan struct{}), c: c, target: target, sock: sock}
	go t.watch()
	if err := t.waitForSocket(ctx); err != nil {
		t.kill()
		return res, err
	}
	res.Forward, res.Source, res.Relabel = true, sock, true
	res.Cleanup = t.cleanup
	return res, nil
}

// pickConnection returns podman's default connection, or its only one.
func pickConnection(ctx context.Context, run Runner) (connection, error) {
	out, err := run.Output(ctx, "podman", "system", "connection", "list", "--format", "json")
	if err != nil {
		return connection{}, fatal(err, "listing podman's connections", hintStart, hintConns)
	}
	var conns []connection
	if len(bytes.TrimSpace(out)) > 0 {
		if err := json.Unmarshal(out, &conns); err != nil {
			return connection{}, fatal(err, "reading `podman system connection list --format json`", hintConns,
				"update podman if `podman system connection list --format json` prints no JSON array")
		}
	}
	var names []string
	for _, c := range conns {
		if c.Default {
			return c, nil
		}
		names = append(names, strconv.Quote(c.Name))
	}
	switch len(conns) {
	case 1:
		return conns[0], nil
	case 0:
		return connection{}, fatal(nil, "podman has no connection to a machine",
			"create and start one: `podman machine init`, then `podman machine start`")
	}
	return connection{}, fatal(nil, fmt.Sprintf("podman has %d connections and none is the default: %s", len(conns), strings.Join(names, ", ")),
		"choose one: `podman system connection default NAME`, NAME one of "+strings.Join(names, ", "))
}

// parseURI reads user, host and port from an ssh://user@host:port/... URI.
func parseURI(c connection) (sshTarget, error) {
	bad := func(err error, why string) (sshTarget, error) {
		return sshTarget{}, fatal(err, fmt.Sprintf("podman connection %q has URI %q: %s", c.Name, c.URI, why), hintConns, hintStart)
	}
	u, err := url.Parse(c.URI)
	if err != nil {
		return bad(err, "not a URI")
	}
	if u.Scheme != "ssh" {
		return bad(nil, "want an ssh:// URI")
	}
	host := u.Hostname()
	if host == "" {
		return bad(nil, "no host")
	}
	port := u.Port()
	if port == "" {
		port = "22"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return bad(nil, "bad port "+port)
	}
	dest := host
	if user := u.User.Username(); user != "" {
		dest = user + "@" + host
	}
	return sshTarget{dest: dest, port: port, identity: c.Identity}, nil
}

// tunnel is a running ssh -R and its socket in the VM.
type tunnel struct {
	proc    Process
	done    chan struct{} // closed when proc has exited
	waitErr error         // proc's Wait error, set before done is closed
	c       Config
	target  sshTarget
	sock    string

	once       sync.Once
	cleanupErr error
}

func (t *tunnel) watch() {
	t.waitErr = t.proc.Wait()
	close(t.done)
}

func (t *tunnel) exited() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

func (t *tunnel) kill() error {
	if t.exited() {
		return nil
	}
	if err := t.proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping the ssh tunnel into the podman machine: %w", err)
	}
	return nil
}

func (t *tunnel) exitedError() error {
	return fatal(t.waitErr, "the ssh tunnel into the podman machine exited", hintMachine, t.target.byHand())
}

// waitForSocket probes for the tunnel's socket in the VM every PollInterval
// until PollTimeout. A probe itself is bounded by ssh's ConnectTimeout and
// cut short when the tunnel exits or ctx is done.
func (t *tunnel) waitForSocket(ctx context.Context) error {
	c := t.c
	deadline := c.Clock.Now().Add(c.PollTimeout)
	for {
		probe, cancel := context.WithCancel(ctx)
		stop := make(chan struct{})
		go func() {
			select {
			case <-t.done:
				cancel()
			case <-stop:
			}
		}()
		_, err := c.Run.Output(probe, "ssh", t.target.args(nil, "test", "-S", t.sock)...)
		close(stop)
		cancel()
		switch {
		case t.exited():
			return t.exitedError()
		case ctx.Err() != nil:
			return fmt.Errorf("forwarding the SSH agent: waiting for the tunnel: %w", ctx.Err())
		case err == nil:
			return nil
		}
		remaining := deadline.Sub(c.Clock.Now())
		if remaining <= 0 {
			return fatal(err, fmt.Sprintf("the tunnel's socket %s did not appear in the podman machine within %s", t.sock, c.PollTimeout),
				hintMachine, t.target.byHand())
		}
		select {
		case <-c.Clock.After(min(c.PollInterval, remaining)):
		case <-t.done:
			return t.exitedError()
		case <-ctx.Done():
			return fmt.Errorf("forwarding the SSH agent: waiting for the tunnel: %w", ctx.Err())
		}
	}
}

// cleanup kills the tunnel and removes its socket in the VM, once.
func (t *tunnel) cleanup() error {
	t.once.Do(func() {
		t.cleanupErr = errors.Join(t.kill(), t.removeSocket())
	})
	return t.cleanupErr
}

var errCleanupTimeout = errors.New("cleanup timed out")

// removeSocket removes the socket in the VM, giving up after CleanupTimeout
// (the VM may be stopped or gone).
func (t *tunnel) removeSocket() error {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-t.c.Clock.After(t.c.CleanupTimeout):
			cancel(errCleanupTimeout)
		case <-finished:
		}
	}()
	_, err := t.c.Run.Output(ctx, "ssh", t.target.args(nil, "rm", "-f", t.sock)...)
	if err == nil {
		return nil
	}
	if context.Cause(ctx) == errCleanupTimeout {
		return fmt.Errorf("removing %s in the podman machine: gave up after %s: %w", t.sock, t.c.CleanupTimeout, err)
	}
	return fmt.Errorf("removing %s in the podman machine: %w", t.sock, err)
}
