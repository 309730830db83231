// Package gateway is the egress gateway of allowlist sandboxes: the only way
// out of a sandbox's internal network. Every connection is decided by an
// egress.Policy and written to the decision log (package decisionlog).
//
// Two ways through, both on:
//   - explicit: an HTTP proxy (absolute-URI requests and CONNECT) and a SOCKS5
//     proxy, for tools that honour HTTP_PROXY, HTTPS_PROXY and ALL_PROXY;
//   - transparent: a DNS responder that answers allowed names with the
//     gateway's own address and the rest NXDOMAIN, a TLS listener that routes
//     by SNI, an HTTP listener that routes by Host, and TCP forwards for
//     host:port rules, for tools that ignore proxy variables.
//
// Config.Bandwidth caps the bytes relayed each way, for the whole gateway.
// Listen binds every listener of a gateway on its address, and the Server it
// returns serves them all.
//
// The network is reached only through Config.Resolve and Config.Dial, so tests
// point the gateway at servers they started themselves. The gateway never
// connects to an address no rule can allow (egress.AlwaysDenied), whatever
// an allowed name resolves to, nor to an address it listens on.
package gateway

import (
	"cmp"
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

// Config is what one gateway enforces and how it reaches the outside.
type Config struct {
	Policy egress.Policy
	// Profile is where the profile's network.allow is, for the hint in a
	// denial; it is quoted as it is. FILE:LINE: a rule to add there; FILE
	// alone: a user's file with no allow list of its own, the lines to add;
	// builtin:NAME:LINE: a built-in, which nobody can edit, so a profile of
	// the user's own extending it (`init --extends NAME`), and the lines.
	Profile string
	// DenyAt is where network.deny is, as FILE:LINE; Profile when empty.
	DenyAt string
	// Resolve looks up an allowed name upstream. Default: the system's
	// resolver, without the name servers on SandboxNet.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// SandboxNet is the sandbox network the gateway serves. The system's
	// name servers there are never asked: on Podman the host serves DNS on
	// every network (aardvark-dns), the sandbox's too, and lists it among
	// the gateway's name servers in an order that changes from one run to
	// the next; a host that rejects what reaches it from a sandbox network
	// (e2e/podman-setup.sh does) would make a lookup wait for its
	// timeouts (the kernel rate-limits the rejections), while the
	// servers of the gateway's other networks answer at once.
	SandboxNet netip.Prefix
	// Dial connects to an upstream address. Default: a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Log receives one entry per decision. Required.
	Log *decisionlog.Writer
	// Now is the clock of the log. Default: time.Now.
	Now func() time.Time
	// Bandwidth caps the relayed bytes, in bytes per second each way, shared
	// by all the gateway's connections (egress.ParseBandwidth reads it from a
	// profile). 0 means no cap. It is read at the first relayed byte.
	Bandwidth int64
	// Kernel, when set, forwards the connections to allowed names in the
	// kernel, through the virtual addresses of Virtual (see kernel.go); it
	// is not used with a Bandwidth cap, which only user space enforces.
	Kernel Kernel
	// Virtual are the addresses DNS gives allowed names when Kernel is set:
	// a prefix of the sandbox network that no container has. They are never
	// an upstream.
	Virtual netip.Prefix
	// Ask, when set (network.unlisted: ask), is asked about a connection or
	// a lookup that no rule matches, which waits for its answer (ask.go).
	Ask *ask.Broker
	// Secrets are the variables whose sentinels the gateway replaces with
	// their real values, and the hosts each may go to (broker.go); the
	// values come with SetRun. The connections to those
	// hosts, and to those whose requests the Policy limits, the gateway
	// opens (intercept.go), and never forwards in the kernel.
	Secrets []SecretHosts
	// Issuer is the run's CA, which the gateway made, and signs the
	// certificates of the connections it opens; needed by SetRun.
	Issuer *broker.Issuer
	// UpstreamRoots verify the upstreams of the connections the gateway
	// opens; nil: the system's roots.
	UpstreamRoots *x509.CertPool

	run       atomic.Pointer[run]
	iceptOnce sync.Once
	icept     *interceptor

	asked remembered // the run's decisions of the user's

	virtual   *virtualTable
	lookups   lookupCache // the system resolver's answers, when Resolve is nil
	limitOnce sync.Once
	limits    [2]*limiter // by direction; nil without a cap

	ownMu sync.Mutex
	own   []netip.Addr // where Listen listens: never an upstream
}

func (c *Config) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if c.Resolve != nil {
		return c.Resolve(ctx, host)
	}
	return c.lookups.resolve(ctx, c.systemResolver(), host, c.now())
}

// systemResolver is the system's resolver, without the name servers on
// SandboxNet.
func (c *Config) systemResolver() *net.Resolver {
	if !c.SandboxNet.IsValid() {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
		if ap, err := netip.ParseAddrPort(address); err == nil && c.SandboxNet.Contains(ap.Addr().Unmap()) {
			return nil, fmt.Errorf("the name server %s is on the sandbox network %s: not asked", address, c.SandboxNet)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}}
}

// resolveTTL is how long the gateway reuses an upstream answer. Short, so a
// name whose addresses move (a CDN) follows them within seconds, but long
// enough that a burst of connections costs one lookup.
const resolveTTL = 5 * time.Second

// lookupCache holds the system resolver's recent answers.
type lookupCache struct {
	mu sync.Mutex
	m  map[string]cachedLookup
}

type cachedLookup struct {
	addrs   []netip.Addr
	expires time.Time
}

func (l *lookupCache) resolve(ctx context.Context, r *net.Resolver, host string, now time.Time) ([]netip.Addr, error) {
	l.mu.Lock()
	hit, ok := l.m[host]
	l.mu.Unlock()
	if ok && now.Before(hit.expires) {
		return slices.Clone(hit.addrs), nil
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil || len(l.m) > 4096 {
		l.m = map[string]cachedLookup{}
	}
	l.m[host] = cachedLookup{addrs: slices.Clone(addrs), expires: now.Add(resolveTTL)}
	return addrs, nil
}

func (c *Config) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if c.Dial != nil {
		return c.Dial(ctx, network, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (c *Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// decide asks the policy (and the user's decisions of the run, when the
// gateway asks) and returns the log entry it starts. It never waits: see
// decideAsk.
func (c *Config) decide(client net.Addr, via, host string, port uint16) decisionlog.Entry {
	e, _ := c.decideEntry(client, via, host, port)
	return e
}

// decideEntry is decide; asks reports that the user must be asked, as
// nothing decided host:port.
func (c *Config) decideEntry(client net.Addr, via, host string, port uint16) (e decisionlog.Entry, asks bool) {
	d := c.Policy.Decide(host, port)
	e = decisionlog.Entry{Time: c.now().UTC(), Via: via, Host: host, Port: port, Allowed: d.Allowed, Rule: d.Rule, Reason: d.Reason, DecidedBy: ask.ByRule}
	if client != nil {
		e.Client = client.String()
	}
	if c.Ask == nil || !askable(d, host) {
		return e, false
	}
	return e, !c.rememberedEntry(&e)
}

// DenialHint is what a client denied host:port is told (the body of a 403,
// for one): the destination, why, and what in the profile would allow it, or
// that nothing can. Config.Profile locates the profile.
func (c *Config) DenialHint(host string, port uint16) string {
	d := c.Policy.Decide(host, port)
	target := egress.Suggest(host, port)
	where := cmp.Or(c.Profile, "the profile")
	if d.Allowed {
		return "propio-sandbox gateway: " + target + " is allowed (" + d.Reason + ").\n"
	}
	head := "propio-sandbox gateway: " + target + " is not allowed (" + d.Reason + ").\n"
	add := c.allowAdvice(target)
	switch {
	case d.AlwaysDenied:
		return head + "It can never be allowed: no rule in " + where + " can change that.\n"
	case strings.HasPrefix(d.Rule, "grant:"): // a deny grant of the user's
		return head + grantAdvice(d.Rule)
	case d.Rule != "": // a deny rule: say which would have to go
		denies, after := withoutDenies(c.Policy, host, port)
		quoted := make([]string, len(denies))
		for i, r := range denies {
			quoted[i] = strconv.Quote(r)
		}
		rules, that := strings.Join(quoted, " and "), "that deny rule"
		if len(denies) > 1 {
			that = "those deny rules"
		}
		head = "propio-sandbox gateway: " + target + " is not allowed: it is denied by network.deny " + rules + " in " + cmp.Or(c.DenyAt, where) + ".\n"
		if after.Allowed {
			return head + "Removing " + that + " would allow it (network.allow " + strconv.Quote(after.Rule) + " matches).\n"
		}
		return head + "To allow it, remove " + that + " and " + add
	case isAddress(host) && c.allowListAt():
		return head + "To allow it, add an address rule to network.allow (" + where + "):\n    - " + strconv.Quote(target) + "\n"
	}
	return head + "To allow it, " + add
}

// grantAdvice says how to undo the deny grant named origin
// (grant:FILE:N): remove it, then start the sandbox again.
func grantAdvice(origin string) string {
	rest := strings.TrimPrefix(origin, "grant:")
	i := strings.LastIndexByte(rest, ':')
	file, n := rest[:max(i, 0)], rest[i+1:]
	return "You denied it for good: grant " + n + " in " + file + ".\n" +
		"To allow it, run `propio-sandbox grants rm " + n + "` in the workspace, and start the sandbox again.\n"
}

// allowAdvice says how to add an allow rule for target, by where
// Config.Profile says the allow list is: under network.allow at FILE:LINE; in
// a file that has none of its own (FILE alone), as a whole network.allow; or,
// for a built-in profile (builtin:NAME:LINE), which nobody can edit, in a
// profile of the user's own that extends it, with the command that makes one.
func (c *Config) allowAdvice(target string) string {
	where := cmp.Or(c.Profile, "the profile")
	lines := "    network:\n      allow:\n        - " + strconv.Quote(target) + "\n"
	if rest, ok := strings.CutPrefix(c.Profile, "builtin:"); ok {
		name, _, _ := strings.Cut(rest, ":")
		return "make a profile of your own that extends the built-in " + name + " (" + where + " cannot be edited):\n" +
			"    propio-sandbox init --extends " + name + "\n" +
			"then add these lines to the .propio/sandbox.yaml it writes, and run `propio-sandbox trust`:\n" + lines
	}
	if !c.allowListAt() {
		return "add these lines to " + where + " (allow: under its network: section, if it has one):\n" + lines
	}
	return "add to network.allow (" + where + "):\n    - " + strconv.Quote(target) + "\n"
}

// allowListAt reports whether Config.Profile is FILE:LINE of an allow list
// the user can edit (or unknown), rather than a built-in or a file alone.
func (c *Config) allowListAt() bool {
	if c.Profile == "" {
		return true
	}
	if strings.HasPrefix(c.Profile, "builtin:") {
		return false
	}
	i := strings.LastIndexByte(c.Profile, ':')
	return i >= 0 && i < len(c.Profile)-1 && strings.Trim(c.Profile[i+1:], "0123456789") == ""
}

// isAddress reports whether host is an address rather than a name.
func isAddress(host string) bool {
	_, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil
}

// withoutDenies lists the deny rules of p that deny host:port (each that
// still denies it once those before it are gone), and decides host:port
// without them.
func withoutDenies(p egress.Policy, host string, port uint16) ([]string, egress.Decision) {
	p.Deny = slices.Clone(p.Deny)
	var rules []string
	for {
		d := p.Decide(host, port)
		if d.Allowed || d.AlwaysDenied || d.Rule == "" {
			return rules, d
		}
		n := len(p.Deny)
		p.Deny = slices.DeleteFunc(p.Deny, func(r egress.Rule) bool { return r.Name() == d.Rule })
		if len(p.Deny) == n {
			return rules, d // a rule that is no deny rule: cannot happen
		}
		rules = append(rules, d.Rule)
	}
}
