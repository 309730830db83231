// Package egress decides which destinations a sandbox with an allowlist may
// reach. It is pure: rules are parsed from profile strings and decisions are
// made on names, addresses and ports, with no I/O. The gateway (which does
// the I/O) asks it for every connection.
//
// Rule syntax, as written in network.allow and network.deny:
//
//	api.openrouter.ai         that name, ports 80 and 443
//	*.amazonaws.com           any subdomain of amazonaws.com (not the name itself), ports 80 and 443
//	github.com:22             that name, port 22 only
//	203.0.113.7, [2001:db8::1]:443   an address, which only an address rule can allow
//
// `*`, a wildcard over a single label (`*.com`) and wildcards anywhere but
// the front are rejected: a rule must name what it allows.
//
// Some destinations no rule can allow, and a rule naming one is refused:
// link-local addresses (where cloud metadata services live) and the other
// metadata addresses, loopback (in the gateway's network namespace loopback is
// the gateway itself), the unspecified addresses and 0.0.0.0/8, and the
// container engine's API ports 2375 and 2376 on any host. A name that
// resolves to such an address is refused by the gateway at connection time.
//
// ParseBandwidth reads the gateway's bandwidth cap, as tc writes rates.
package egress

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Rule is one parsed allow or deny rule.
type Rule struct {
	Text     string     // as written in the profile
	Host     string     // lower-case name without "*.", or empty for an address rule
	Wildcard bool       // subdomains of Host only, never Host itself
	Addr     netip.Addr // the address of an address rule
	Port     uint16     // 0 means 80 and 443
	// Origin is where a rule that is not the profile's comes from, as
	// decisions name it: grant:FILE:N for the user's grant N in FILE
	// (internal/grants). Empty for a profile's rule.
	Origin string
	// Methods and Paths limit the HTTP requests an allow rule lets through
	// (limits.go): nil is any method (the policy's Methods, when it has
	// them), any path.
	Methods []string
	Paths   []string
}

// HostPattern is the rule's destination without its port: its address,
// *.name for a wildcard, or its name.
func (r Rule) HostPattern() string {
	switch {
	case r.Addr.IsValid():
		return r.Addr.String()
	case r.Wildcard:
		return "*." + r.Host
	}
	return r.Host
}

// Name is how decisions name the rule: its Origin, else its text.
func (r Rule) Name() string {
	if r.Origin != "" {
		return r.Origin
	}
	return r.Text
}

// by says which rule decided, for a decision's reason: network.deny "x", or
// grant:FILE:N "x".
func (r Rule) by(list string) string {
	if r.Origin != "" {
		return fmt.Sprintf("%s %q", r.Origin, r.Text)
	}
	return fmt.Sprintf("network.%s %q", list, r.Text)
}

// ParseRule parses one rule, or says what is wrong with it.
func ParseRule(s string) (Rule, error) {
	r := Rule{Text: s}
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return r, errors.New("empty rule")
	}
	if strings.Contains(s, "://") || strings.ContainsAny(s, "/?#@ ") {
		return r, fmt.Errorf("%q is not a host: write a name, *.name or an address, with :port if needed (no scheme or path)", r.Text)
	}
	host, port, err := splitPort(s)
	if err != nil {
		return r, fmt.Errorf("%q: %w", r.Text, err)
	}
	r.Port = port
	if enginePort(port) {
		return r, fmt.Errorf("%q can never be allowed: %s", r.Text, engineReason)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		r.Addr = a.Unmap()
		if why := AlwaysDeniedReason(r.Addr); why != "" {
			return r, fmt.Errorf("%q can never be allowed: %s", r.Text, why)
		}
		return r, nil
	}
	if host == "*" || host == "*." {
		return r, fmt.Errorf("%q is too broad: a rule must name what it allows", r.Text)
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Wildcard = true
		host = rest
	}
	if strings.Contains(host, "*") {
		return r, fmt.Errorf("%q: a wildcard may only start a rule, as in *.example.com", r.Text)
	}
	host = strings.TrimSuffix(host, ".")
	if err := checkName(host); err != nil {
		return r, fmt.Errorf("%q: %w", r.Text, err)
	}
	if r.Wildcard && !strings.Contains(host, ".") {
		return r, fmt.Errorf("%q is too broad: a wildcard must keep at least two labels, as in *.example.com", r.Text)
	}
	r.Host = host
	return r, nil
}

// splitPort separates an optional :port (and [ ] around an IPv6 address).
func splitPort(s string) (string, uint16, error) {
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return "", 0, errors.New("missing ] after an IPv6 address")
		}
		host, rest := s[1:end], s[end+1:]
		if rest == "" {
			return host, 0, nil
		}
		p, ok := strings.CutPrefix(rest, ":")
		if !ok {
			return "", 0, errors.New("want :port after ]")
		}
		port, err := parsePort(p)
		return host, port, err
	}
	if strings.Count(s, ":") > 1 { // a bare IPv6 address
		return s, 0, nil
	}
	host, p, ok := strings.Cut(s, ":")
	if !ok {
		return s, 0, nil
	}
	port, err := parsePort(p)
	return host, port, err
}

func parsePort(p string) (uint16, error) {
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q is not a number from 1 to 65535", p)
	}
	return uint16(n), nil
}

// checkName accepts DNS names: labels of letters, digits and hyphens.
func checkName(host string) error {
	if host == "" {
		return errors.New("no host name")
	}
	if len(host) > 253 {
		return errors.New("host name longer than 253 characters")
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%q is not a valid label of a host name", label)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%q is not a valid label of a host name", label)
			}
		}
	}
	return nil
}

// matches reports whether the rule covers host (a lower-case name without a
// trailing dot, or an address) and port.
func (r Rule) matches(host string, addr netip.Addr, port uint16) bool {
	if r.Port == 0 {
		if port != 80 && port != 443 {
			return false
		}
	} else if r.Port != port {
		return false
	}
	switch {
	case r.Addr.IsValid():
		return addr.IsValid() && addr == r.Addr
	case addr.IsValid():
		return false // a name rule never allows a raw address
	case r.Wildcard:
		return strings.HasSuffix(host, "."+r.Host)
	}
	return host == r.Host
}

// Covers reports whether the rule names host (a name or an address, as
// Decide takes it) on port, whatever it allows or denies there.
func (r Rule) Covers(host string, port uint16) bool {
	h, addr := normalHost(host)
	return r.matches(h, addr, port)
}

// Policy is a profile's allow and deny rules, with the user's grants
// among them (rules with an Origin); deny wins over allow.
type Policy struct {
	Allow []Rule
	Deny  []Rule
	// Methods are the methods an allow rule that names none of its own lets
	// through (network.methods: GET, HEAD and OPTIONS are "read-only web");
	// nil is any.
	Methods []string
}

// ParsePolicy parses the allow and deny lists, returning every error.
func ParsePolicy(allow, deny []string) (Policy, error) {
	var p Policy
	var errs []error
	for i, s := range allow {
		r, err := ParseRule(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("allow[%d]: %w", i, err))
			continue
		}
		p.Allow = append(p.Allow, r)
	}
	for i, s := range deny {
		r, err := ParseRule(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("deny[%d]: %w", i, err))
			continue
		}
		p.Deny = append(p.Deny, r)
	}
	return p, errors.Join(errs...)
}

// AddGrant adds one of the user's grants (internal/grants) to the policy:
// an allow or deny rule, text as network.allow writes it, named by origin
// (grant:FILE:N) in decisions. Deny wins over allow as for any rule: a deny
// grant over the profile's allow rules, the profile's deny rules over an
// allow grant; what no rule can allow stays denied.
func (p *Policy) AddGrant(deny bool, origin, text string) error {
	r, err := ParseRule(text)
	if err != nil {
		return fmt.Errorf("%s: %w", origin, err)
	}
	r.Origin = origin
	if deny {
		p.Deny = append(p.Deny, r)
	} else {
		p.Allow = append(p.Allow, r)
	}
	return nil
}

// Decision is the answer for one destination.
type Decision struct {
	Allowed bool
	Rule    string // the rule that decided, as written (a grant's Origin); empty when none did
	Reason  string // why, in words for a log line or a 403 page
	// AlwaysDenied is set when no rule could allow the destination: an
	// address AlwaysDenied reports, the container engine's API port, or a
	// host that is not a valid name.
	AlwaysDenied bool
	// Request is set when the destination is allowed but the request is
	// not, by the methods or paths of its rules (DecideRequest).
	Request bool
}

// Decide says whether host:port may be reached. host is a name or an
// address. What AlwaysDenied reports and the container engine's API ports
// are always denied, and a raw address only passes an address rule.
func (p Policy) Decide(host string, port uint16) Decision {
	host, addr := normalHost(host)
	if addr.IsValid() {
		if why := AlwaysDeniedReason(addr); why != "" {
			return Decision{Reason: why, AlwaysDenied: true}
		}
	} else if checkName(host) != nil {
		return Decision{Reason: "not a valid host name", AlwaysDenied: true}
	}
	if enginePort(port) {
		return Decision{Reason: engineReason, AlwaysDenied: true}
	}
	for _, r := range p.Deny {
		if r.matches(host, addr, port) {
			return Decision{Rule: r.Name(), Reason: "denied by " + r.by("deny")}
		}
	}
	for _, r := range p.Allow {
		if r.matches(host, addr, port) {
			return Decision{Allowed: true, Rule: r.Name(), Reason: "allowed by " + r.by("allow")}
		}
	}
	if addr.IsValid() {
		return Decision{Reason: "raw addresses are denied unless an address rule allows them"}
	}
	return Decision{Reason: "no network.allow rule matches"}
}

// normalHost is host as Decide reads it: lower case, without a trailing
// dot or brackets, and its address when it is one (else the zero Addr).
func normalHost(host string) (string, netip.Addr) {
	host = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(host)), ".")
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host, netip.Addr{}
	}
	return host, addr.Unmap()
}

// Suggest is the rule that would allow host:port, for the hint in a denial.
func Suggest(host string, port uint16) string {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil && a.Is6() {
		host = "[" + a.String() + "]"
	}
	if port == 80 || port == 443 {
		return host
	}
	return host + ":" + strconv.Itoa(int(port))
}

// metadata are the cloud metadata addresses outside the link-local ranges.
var metadata = []netip.Addr{
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("fd00:ec2::254"),   // AWS, over IPv6
}

// AlwaysDenied reports the addresses no rule can allow: link-local (where
// the cloud metadata services live), other metadata addresses, loopback, and
// the unspecified addresses.
func AlwaysDenied(a netip.Addr) bool { return AlwaysDeniedReason(a) != "" }

// AlwaysDeniedReason says why no rule can allow a, or returns "" when a rule
// can.
func AlwaysDeniedReason(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || slices.Contains(metadata, a):
		return "link-local and cloud metadata addresses are always denied"
	case a.IsLoopback():
		return "loopback addresses are always denied, since in the gateway loopback is the gateway itself"
	case a.IsUnspecified() || a.Is4() && a.As4()[0] == 0:
		return "the unspecified address and 0.0.0.0/8 are always denied"
	}
	return ""
}

// The container engine's API ports (Docker's plain and TLS ports): no rule
// can allow them, on any host, so a sandbox never drives an engine.
const (
	engineAPIPort    = 2375
	engineAPITLSPort = 2376
	engineReason     = "the container engine's API port is always denied, on any host"
)

func enginePort(port uint16) bool { return port == engineAPIPort || port == engineAPITLSPort }

// Bandwidth limits, in bytes per second: MinBandwidth is 8kbit, so a typo
// cannot leave a sandbox with a network too slow to notice it is capped;
// MaxBandwidth is 1000gbit.
const (
	MinBandwidth = 1000
	MaxBandwidth = 125_000_000_000
)

// bitUnits are the units of a rate, in bits per second (k is 1000, as in tc).
var bitUnits = []struct {
	suffix string
	bits   int64
}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}}

// ParseBandwidth reads a rate as tc writes it: a positive number, with a
// decimal part if needed, followed by bit, kbit, mbit or gbit (per second,
// k = 1000), such as 10mbit or 1.5gbit. It returns bytes per second, rounded
// down, from MinBandwidth to MaxBandwidth.
func ParseBandwidth(s string) (int64, error) {
	bad := fmt.Errorf("%q is not a rate: write a number followed by bit, kbit, mbit or gbit (per second), as in 10mbit", s)
	for _, u := range bitUnits {
		num, ok := strings.CutSuffix(s, u.suffix)
		if !ok {
			continue
		}
		whole, frac, _ := strings.Cut(num, ".")
		if !digits(whole) || strings.Contains(num, ".") && !digits(frac) {
			return 0, bad
		}
		r, ok := new(big.Rat).SetString(num)
		if !ok {
			return 0, bad
		}
		r.Mul(r, big.NewRat(u.bits, 8))
		switch {
		case r.Cmp(big.NewRat(MinBandwidth, 1)) < 0:
			return 0, fmt.Errorf("%q is below the minimum rate of 8kbit (1000 bytes per second)", s)
		case r.Cmp(big.NewRat(MaxBandwidth, 1)) > 0:
			return 0, fmt.Errorf("%q is above the maximum rate of 1000gbit", s)
		}
		return new(big.Int).Quo(r.Num(), r.Denom()).Int64(), nil
	}
	return 0, bad
}

// digits reports whether s is one or more ASCII digits.
func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
