// Package gatewayd is the process of an allowlist sandbox's egress gateway:
// what `propio-sandbox gateway` runs inside the gateway's container, from an
// image made of the launcher's own binary. Started as root, it runs itself
// again as the user it is given, with CAP_NET_ADMIN as its only capability
// when the kernel forwards; it appends its decisions to the decision log
// (package decisionlog), has the kernel forward allowed names when it can
// (package natfwd), and serves the gateway (package gateway) until it is
// signalled or its context ends.
//
// It parses no flags and prints nothing itself: the CLI hands it typed
// Options and presents what it reports.
package gatewayd

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
	"github.com/propio/propio-sandbox/internal/gateway"
)

// Options are what one gateway process serves, as the generator writes them
// into the gateway service's command.
type Options struct {
	// Address is the gateway's address on the sandbox network: every
	// listener binds it, and DNS answers with it.
	Address netip.Addr
	Policy  egress.Policy
	// Profile and DenyAt are where network.allow and network.deny are, as
	// FILE:LINE, named in denials.
	Profile, DenyAt string
	// Bandwidth caps the throughput each way, in bytes per second; 0: no cap.
	Bandwidth int64
	// Log is the decision log to append to; "" writes decisions to Stdout.
	Log string
	// Virtual is the prefix (as written, an invalid one is reported) through
	// whose addresses the kernel forwards allowed names; "" relays in user
	// space.
	Virtual string
	// User is who a gateway started as root serves as; nil: whoever
	// started it.
	User *User
	// Args are this process's arguments, to run itself again as User.
	Args []string
	// Stdout and Stderr are the process's: decisions without a Log, and the
	// output of the process run as User.
	Stdout, Stderr io.Writer
	// Report receives what the gateway says about itself, a line at a time:
	// "note: ..." for what it could not do, then "serving on ...".
	Report func(line string)
	// Ports are the gateway's ports; zero: the defaults (tests bind others).
	Ports gateway.Ports
	// Ask is the sandbox's ask directory (network.unlisted: ask), with its
	// sandbox.json: the gateway asks about what no rule matches, and serves
	// ask.sock there. "": it never asks.
	Ask string
	// AskTimeout is how long an asking connection waits for a decision.
	AskTimeout time.Duration
	// Secrets are the variables whose sentinels the gateway replaces, and
	// the hosts each may go to.
	Secrets []gateway.SecretHosts
	// Broker is the run's broker directory (package broker): the gateway
	// writes its CA's certificate there, and takes the run's secrets from
	// the file there, at start and whenever a run writes one. "": it opens
	// no connection over TLS.
	Broker string
	// UpstreamCA is a PEM file of CA certificates the gateway trusts for
	// the upstreams it opens, beside the system's.
	UpstreamCA string
}

// User is a user a gateway started as root serves as: for a UID above 0 it
// runs itself again as UID:GID (GID -1: UID's number); for UID 0 it stays
// root with no more than CAP_NET_ADMIN.
type User struct{ UID, GID int }

func (o *Options) report(format string, args ...any) {
	if o.Report != nil {
		o.Report(fmt.Sprintf(format, args...))
	}
}

// Run serves the gateway until it gets SIGTERM, SIGINT or SIGHUP or ctx
// ends. When it runs itself again as o.User, it waits for that process, and
// returns its *exec.ExitError when it fails: that process has said why.
func Run(ctx context.Context, o Options) error {
	if os.Geteuid() == 0 && o.User != nil && o.User.UID > 0 {
		return runAs(o, *o.User)
	}
	if os.Geteuid() == 0 && o.User != nil && o.User.UID == 0 {
		// The user is root: stay root, with nothing more than kernel
		// forwarding needs.
		if err := dropCapabilities(o.Virtual != ""); err != nil {
			// A cgo build cannot change every thread at once; its
			// SETUID and SETGID stay, in a container without anything
			// to run.
			o.report("note: %v", err)
		}
	}
	return serve(ctx, o)
}

func serve(ctx context.Context, o Options) error {
	log := decisionlog.NewWriter(o.Stdout)
	if o.Log != "" {
		var err error
		if log, err = decisionlog.Append(o.Log); err != nil {
			return err
		}
	}
	defer log.Close()
	cfg := &gateway.Config{Policy: o.Policy, Profile: o.Profile, DenyAt: o.DenyAt, Log: log, Bandwidth: o.Bandwidth, Secrets: o.Secrets,
		SandboxNet: resolverNetwork(networkOf(o.Address), "/etc/resolv.conf")}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := brokering(ctx, cfg, &o); err != nil {
		return err
	}
	if o.Virtual != "" && o.Bandwidth == 0 {
		if note := kernelForwarding(ctx, cfg, o.Virtual, o.Address.Unmap()); note != "" {
			o.report("note: %s", note)
		}
	}
	if o.Ask != "" {
		stopAsk, err := serveAsk(cfg, o)
		if err != nil {
			return err
		}
		defer stopAsk()
	}
	srv, err := gateway.Listen(cfg, o.Address, o.Ports)
	if err != nil {
		return err
	}
	for _, s := range srv.Skipped {
		o.report("note: %s", s)
	}
	if err := publishCA(cfg, &o); err != nil {
		srv.Close()
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
		case <-ctx.Done():
		}
		srv.Close()
	}()
	how := "relayed in user space"
	if cfg.Kernel != nil {
		how = "to allowed names forwarded by the kernel through " + o.Virtual
	}
	o.report("serving on %s (%d allow, %d deny rules, %d secrets; connections %s)", o.Address, len(o.Policy.Allow), len(o.Policy.Deny), len(o.Secrets), how)
	return srv.Serve()
}

// runAs runs the gateway again as u, with CAP_NET_ADMIN as its
// only capability (ambient, so it survives the exec) when it forwards in the
// kernel, and waits for it, passing on the signals it gets. A container
// engine gives a non-root user no capability, so the gateway starts as root
// and leaves it at once: the log it writes is the user's, and nothing else
// runs as root.
func runAs(o Options, u User) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("gateway: finding this executable: %w", err)
	}
	gid := u.GID
	if gid < 0 {
		gid = u.UID
	}
	cmd := exec.Command(self, o.Args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, o.Stdout, o.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(gid), Groups: []uint32{}}}
	if o.Virtual != "" {
		keepNetAdmin(cmd.SysProcAttr)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("gateway: starting as %d:%d: %w", u.UID, gid, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case err := <-done:
			return err
		}
	}
}

// networkOf is the network of the interface that has addr (the sandbox
// network, for the gateway's address there), or no prefix when none has it.
func networkOf(addr netip.Addr) netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Prefix{}
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || ip.Unmap() != addr.Unmap() {
			continue
		}
		ones, bits := n.Mask.Size()
		if ip.Is4In6() && bits == 128 {
			ones -= 96
		}
		return netip.PrefixFrom(ip.Unmap(), ones).Masked()
	}
	return netip.Prefix{}
}

// resolverNetwork is net when the resolv.conf at path lists a name server
// on it (Podman's on the sandbox network), else no prefix: the gateway then
// asks the system's resolver as it is (Docker's lists only its own,
// 127.0.0.11).
func resolverNetwork(network netip.Prefix, path string) netip.Prefix {
	b, err := os.ReadFile(path)
	if err != nil || !network.IsValid() {
		return netip.Prefix{}
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(f[1]); err == nil && network.Contains(a.Unmap()) {
			return network
		}
	}
	return netip.Prefix{}
}
