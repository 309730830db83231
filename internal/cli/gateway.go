package cli

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
	"github.com/propio/propio-sandbox/internal/gateway"
	"github.com/propio/propio-sandbox/internal/natfwd"
	"github.com/spf13/cobra"
)

// gatewayFlags are what the generator writes into the gateway service's
// command; render shows them.
type gatewayFlags struct {
	address   string
	allow     []string
	deny      []string
	bandwidth string
	profile   string
	denyAt    string
	log       string
	virtual   string
	uid, gid  int
}

func newGateway(a *app) *cobra.Command {
	var f gatewayFlags
	cmd := &cobra.Command{
		Use:   "gateway --address IP [--allow RULE]... [--deny RULE]... [--log FILE]",
		Short: "Serve an allowlist sandbox's egress gateway (runs inside the gateway container)",
		Long: `Serve the egress gateway of a sandbox with network.mode allowlist: an HTTP proxy
(port 3128, with CONNECT), a SOCKS5 proxy (1080), a DNS server (53) that answers
allowed names with the gateway's address and refuses the rest, TLS routing by SNI
(443), HTTP routing by Host (80) and TCP forwards for host:port rules. Every
decision is appended to the log as a JSON line.

run starts it in its own container, from an image made of this very binary; there
is no need to start it by hand.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.gateway(f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.address, "address", "", "the gateway's `IP` on the sandbox network: every listener binds it, and DNS answers with it")
	fl.StringArrayVar(&f.allow, "allow", nil, "an allow `RULE`, as in network.allow")
	fl.StringArrayVar(&f.deny, "deny", nil, "a deny `RULE`, as in network.deny")
	fl.StringVar(&f.bandwidth, "bandwidth", "", "cap the throughput each way, as `RATE` 10mbit")
	fl.StringVar(&f.profile, "profile", "", "the profile `FILE:LINE` of network.allow, named in denials")
	fl.StringVar(&f.denyAt, "deny-at", "", "the profile `FILE:LINE` of network.deny, named when a deny rule refuses")
	fl.StringVar(&f.log, "log", "", "append decisions to `FILE` (default: standard output)")
	fl.StringVar(&f.virtual, "virtual", "", "forward allowed names in the kernel, through the addresses of `PREFIX` (needs CAP_NET_ADMIN and net.ipv4.ip_forward=1)")
	fl.IntVar(&f.uid, "uid", -1, "started as root: serve as `UID`, keeping only CAP_NET_ADMIN")
	fl.IntVar(&f.gid, "gid", -1, "with --uid: serve as group `GID`")
	return cmd
}

func (a *app) gateway(f gatewayFlags) error {
	if os.Geteuid() == 0 && f.uid > 0 {
		return a.gatewayAs(f)
	}
	if os.Geteuid() == 0 && f.uid == 0 {
		// The user is root: stay root, with nothing more than kernel
		// forwarding needs.
		if err := dropCapabilities(f.virtual != ""); err != nil {
			// A cgo build cannot change every thread at once; its
			// SETUID and SETGID stay, in a container without anything
			// to run.
			fmt.Fprintf(a.stderr, "%s gateway: note: %v\n", name, err)
		}
	}
	addr, err := netip.ParseAddr(f.address)
	if err != nil {
		return usageError{fmt.Errorf("--address: %q is not an IP address", f.address)}
	}
	policy, err := egress.ParsePolicy(f.allow, f.deny)
	if err != nil {
		return usageError{err}
	}
	var bw int64
	if f.bandwidth != "" {
		if bw, err = egress.ParseBandwidth(f.bandwidth); err != nil {
			return usageError{fmt.Errorf("--bandwidth: %w", err)}
		}
	}
	var out io.Writer = a.stdout
	if f.log != "" {
		lf, err := os.OpenFile(f.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("opening the decision log: %w", err)
		}
		defer lf.Close()
		out = lf
	}
	cfg := &gateway.Config{Policy: policy, Profile: f.profile, DenyAt: f.denyAt, Log: decisionlog.NewWriter(out), Bandwidth: bw}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if f.virtual != "" && bw == 0 {
		if note := a.kernelForwarding(ctx, cfg, f.virtual); note != "" {
			fmt.Fprintf(a.stderr, "%s gateway: note: %s\n", name, note)
		}
	}
	srv, err := gateway.Listen(cfg, addr, gateway.Ports{})
	if err != nil {
		return err
	}
	for _, s := range srv.Skipped {
		fmt.Fprintf(a.stderr, "%s gateway: note: %s\n", name, s)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go func() {
		<-sigs
		srv.Close()
	}()
	how := "relayed in user space"
	if cfg.Kernel != nil {
		how = "to allowed names forwarded by the kernel through " + f.virtual
	}
	fmt.Fprintf(a.stderr, "%s gateway: serving on %s (%d allow, %d deny rules; connections %s)\n", name, addr, len(policy.Allow), len(policy.Deny), how)
	return srv.Serve()
}

// gatewayAs runs the gateway again as f.uid:f.gid, with CAP_NET_ADMIN as its
// only capability (ambient, so it survives the exec) when it forwards in the
// kernel, and waits for it, passing on the signals it gets. A container
// engine gives a non-root user no capability, so the gateway starts as root
// and leaves it at once: the log it writes is the user's, and nothing else
// runs as root.
func (a *app) gatewayAs(f gatewayFlags) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("gateway: finding this executable: %w", err)
	}
	gid := f.gid
	if gid < 0 {
		gid = f.uid
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, a.stdout, a.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(f.uid), Gid: uint32(gid), Groups: []uint32{}}}
	if f.virtual != "" {
		keepNetAdmin(cmd.SysProcAttr)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("gateway: starting as %d:%d: %w", f.uid, gid, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case err := <-done:
			if ee, ok := err.(*exec.ExitError); ok {
				return exitCode(ee.ExitCode())
			}
			return err
		}
	}
}

// kernelForwarding sets cfg up to forward allowed names in the kernel
// through the addresses of virtual, and logs each forwarded connection once
// it ends. It returns why it could not ("" when it did); the gateway then
// relays everything in user space.
func (a *app) kernelForwarding(ctx context.Context, cfg *gateway.Config, virtual string) string {
	prefix, err := netip.ParsePrefix(virtual)
	if err != nil {
		return fmt.Sprintf("--virtual %q: %v; relaying in user space", virtual, err)
	}
	w, err := natfwd.NewWatcher()
	if err != nil {
		return fmt.Sprintf("%v; relaying in user space", err)
	}
	fw, err := natfwd.Setup(prefix, gateway.DefaultCatchPort)
	if err != nil {
		w.Close()
		return fmt.Sprintf("%v; relaying in user space", err)
	}
	cfg.Kernel, cfg.Virtual = fw, prefix
	go func() {
		// The kernel sends a connection's DESTROY event, with its bytes, when
		// it removes the expired entry, which its own collection may leave
		// for a minute: sweep every two seconds, so the log is current.
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = natfwd.Sweep()
			}
		}
	}()
	go func() {
		defer w.Close()
		starts := map[[2]netip.AddrPort]time.Time{}
		_ = w.Run(ctx, func(ev natfwd.ConnEvent) {
			if ev.Proto != natfwd.ProtoTCP || !prefix.Contains(ev.Dst.Addr()) || ev.Status&natfwd.StatusDstNAT == 0 {
				return // not a connection the kernel forwarded
			}
			key := [2]netip.AddrPort{ev.Src, ev.Dst}
			switch ev.Type {
			case natfwd.EventNew:
				if len(starts) < 65536 {
					starts[key] = time.Now()
				}
			case natfwd.EventDestroy:
				start, ok := starts[key]
				delete(starts, key)
				if !ok {
					start = time.Now()
				}
				cfg.LogForwarded(gateway.Conn{Start: start, Client: ev.Src, Dst: ev.Dst, Upstream: ev.ReplySrc,
					BytesUp: int64(ev.BytesOrig), BytesDown: int64(ev.BytesReply)})
			}
		})
	}()
	return ""
}
