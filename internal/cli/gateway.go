package cli

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/internal/egress"
	"github.com/propio/propio-sandbox/internal/gatewayd"
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
	ask       string
	askTime   time.Duration
	// grants is the user's grants file; grantAllow and grantDeny its
	// grants, as N=RULE.
	grants                string
	grantAllow, grantDeny []string
	// secrets are NAME=RULE, a host each secret may go to; broker the
	// directory of the run's CA and secrets; upstreamCA a PEM file of CAs;
	// methods the default methods of the allow rules.
	secrets      []string
	secretsClear []string
	broker       string
	upstreamCA   string
	methods      string
}

func newGateway(a *app) *cobra.Command {
	var f gatewayFlags
	cmd := &cobra.Command{
		Use:   "gateway --address IP [--allow RULE]... [--deny RULE]... [--log FILE]",
		Short: "Serve an allowlist sandbox's egress gateway (runs inside the gateway container)",
		Long: `Serve the egress gateway of a sandbox with network.mode allowlist: an HTTP proxy
(port 3128, with CONNECT), a SOCKS5 proxy (1080), a DNS server (53) that answers
allowed names with the gateway's address and refuses the rest, TLS routing by SNI
(443), HTTP routing by Host (80) and TCP forwards for host:port rules. The
hosts of --secret and of allow rules with methods or paths it opens: TLS
terminated with the run's CA (from the run's file in --broker), each request
judged, sentinels replaced with the secrets' values. Every decision is
appended to the log as a JSON line.

run starts it in its own container, from an image made of this very binary; there
is no need to start it by hand.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.gateway(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.address, "address", "", "the gateway's `IP` on the sandbox network: every listener binds it, and DNS answers with it")
	fl.StringArrayVar(&f.allow, "allow", nil, "an allow `RULE`, as in network.allow")
	fl.StringArrayVar(&f.deny, "deny", nil, "a deny `RULE`, as in network.deny")
	fl.StringVar(&f.bandwidth, "bandwidth", "", "cap the throughput each way, as `RATE` 10mbit")
	fl.StringVar(&f.profile, "profile", "", "the profile `FILE:LINE` of network.allow, named in denials")
	fl.StringVar(&f.denyAt, "deny-at", "", "the profile `FILE:LINE` of network.deny, named when a deny rule refuses")
	fl.StringVar(&f.log, "log", "", "append decisions to `FILE` (default: standard output)")
	fl.StringVar(&f.grants, "grants", "", "the user's grants `FILE`, which --grant-allow and --grant-deny come from")
	fl.StringArrayVar(&f.grantAllow, "grant-allow", nil, "the user's allow grant `N=RULE` (grant N of --grants), added to the allow rules")
	fl.StringArrayVar(&f.grantDeny, "grant-deny", nil, "the user's deny grant `N=RULE` (grant N of --grants), added to the deny rules")
	fl.StringVar(&f.virtual, "virtual", "", "forward allowed names in the kernel, through the addresses of `PREFIX` (needs CAP_NET_ADMIN and net.ipv4.ip_forward=1)")
	fl.IntVar(&f.uid, "uid", -1, "started as root: serve as `UID`, keeping only CAP_NET_ADMIN")
	fl.IntVar(&f.gid, "gid", -1, "with --uid: serve as group `GID`")
	fl.StringVar(&f.ask, "ask", "", "ask about destinations no rule matches, serving ask.sock in `DIR` (with its sandbox.json)")
	fl.DurationVar(&f.askTime, "ask-timeout", 60*time.Second, "with --ask: deny a request nobody decided within `DURATION`")
	fl.StringArrayVar(&f.secrets, "secret", nil, "`NAME=RULE`: the real value of secret NAME may go to the hosts of RULE over TLS (once per rule)")
	fl.StringArrayVar(&f.secretsClear, "secret-cleartext", nil, "`NAME=RULE`: the real value of secret NAME may go to the hosts of RULE, a --secret rule of NAME, over plain HTTP too")
	fl.StringVar(&f.broker, "broker", "", "write the run's CA certificate to `DIR`, and take the run's secrets from the run's file there (at start, and whenever one is written)")
	fl.StringVar(&f.upstreamCA, "upstream-ca", "", "trust the CA certificates of PEM `FILE` for the upstreams the gateway opens, beside the system's")
	fl.StringVar(&f.methods, "methods", "", "the HTTP `METHODS` (GET,HEAD) an allow rule that names none lets through")
	return cmd
}

// gateway serves the gateway with the options of f; the process it runs as
// another user reports its own errors, and its exit code is this one's.
func (a *app) gateway(cmd *cobra.Command, f gatewayFlags) error {
	o, err := f.options()
	if err != nil {
		return usageError{err}
	}
	o.Args, o.Stdout, o.Stderr = os.Args[1:], a.stdout, a.stderr
	o.Report = func(line string) { fmt.Fprintf(a.stderr, "%s gateway: %s\n", name, line) }
	err = gatewayd.Run(cmd.Context(), o)
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return exitCode(ee.ExitCode())
	}
	return err
}

// options parses the flags into what the gateway serves.
func (f gatewayFlags) options() (gatewayd.Options, error) {
	o := gatewayd.Options{Profile: f.profile, DenyAt: f.denyAt, Log: f.log, Virtual: f.virtual, Ask: f.ask, AskTimeout: f.askTime, Broker: f.broker, UpstreamCA: f.upstreamCA}
	if f.uid >= 0 {
		o.User = &gatewayd.User{UID: f.uid, GID: f.gid}
	}
	var err error
	if o.Address, err = netip.ParseAddr(f.address); err != nil {
		return o, fmt.Errorf("--address: %q is not an IP address", f.address)
	}
	if o.Policy, err = egress.ParsePolicy(nil, f.deny); err != nil {
		return o, err
	}
	for i, a := range f.allow {
		r, err := egress.ParseFlagRule(a)
		if err != nil {
			return o, fmt.Errorf("allow[%d]: %w", i, err)
		}
		o.Policy.Allow = append(o.Policy.Allow, r)
	}
	if f.methods != "" {
		o.Policy.Methods = strings.Split(f.methods, ",")
		for _, m := range o.Policy.Methods {
			if err := egress.ParseMethod(m); err != nil {
				return o, fmt.Errorf("--methods: %w", err)
			}
		}
	}
	if o.Secrets, err = gatewayd.ParseSecrets(f.secrets, f.secretsClear); err != nil {
		return o, err
	}
	if err := f.addGrants(&o.Policy); err != nil {
		return o, err
	}
	if f.bandwidth != "" {
		if o.Bandwidth, err = egress.ParseBandwidth(f.bandwidth); err != nil {
			return o, fmt.Errorf("--bandwidth: %w", err)
		}
	}
	return o, nil
}

// addGrants adds the user's grants of --grant-allow and --grant-deny to p,
// each named grant:FILE:N.
func (f gatewayFlags) addGrants(p *egress.Policy) error {
	if f.grants == "" && len(f.grantAllow)+len(f.grantDeny) > 0 {
		return errors.New("--grant-allow and --grant-deny need --grants FILE")
	}
	for _, g := range []struct {
		flag  string
		deny  bool
		rules []string
	}{{"--grant-allow", false, f.grantAllow}, {"--grant-deny", true, f.grantDeny}} {
		for _, v := range g.rules {
			n, rule, ok := strings.Cut(v, "=")
			if _, err := strconv.Atoi(n); !ok || err != nil {
				return fmt.Errorf("%s %q: want N=RULE, N the grant's number", g.flag, v)
			}
			if err := p.AddGrant(g.deny, "grant:"+f.grants+":"+n, rule); err != nil {
				return fmt.Errorf("%s: %w", g.flag, err)
			}
		}
	}
	return nil
}
