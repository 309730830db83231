package cli

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/propio/propio-sandbox/internal/egress"
	"github.com/propio/propio-sandbox/internal/gateway"
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
	return cmd
}

func (a *app) gateway(f gatewayFlags) error {
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
	cfg := &gateway.Config{Policy: policy, Profile: f.profile, DenyAt: f.denyAt, Log: gateway.NewLogger(out), Bandwidth: bw}
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
	fmt.Fprintf(a.stderr, "%s gateway: serving on %s (%d allow, %d deny rules)\n", name, addr, len(policy.Allow), len(policy.Deny))
	return srv.Serve()
}
