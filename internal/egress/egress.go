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
package egress

import (
	"errors"
	"fmt"
	"net/netip"
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
	if a, err := netip.ParseAddr(host); err == nil {
		r.Addr = a.Unmap()
		if AlwaysDenied(r.Addr) {
			return r, fmt.Errorf("%q can never be allowed: link-local and cloud metadata addresses are always denied", r.Text)
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

// Policy is a profile's allow and deny rules; deny wins over allow.
type Policy struct {
	Allow []Rule
	Deny  []Rule
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

// Decision is the answer for one destination.
type Decision struct {
	Allowed bool
	Rule    string // the rule that decided, as written; empty when none did
	Reason  string // why, in words for a log line or a 403 page
}

// Decide says whether host:port may be reached. host is a name or an
// address. Link-local and cloud metadata addresses are always denied, and a
// raw address only passes an address rule.
func (p Policy) Decide(host string, port uint16) Decision {
	host = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(host)), ".")
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	addr, err := netip.ParseAddr(host)
	if err == nil {
		addr = addr.Unmap()
		if AlwaysDenied(addr) {
			return Decision{Reason: "link-local and cloud metadata addresses are always denied"}
		}
	} else {
		addr = netip.Addr{}
		if checkName(host) != nil {
			return Decision{Reason: "not a valid host name"}
		}
	}
	for _, r := range p.Deny {
		if r.matches(host, addr, port) {
			return Decision{Rule: r.Text, Reason: fmt.Sprintf("denied by network.deny %q", r.Text)}
		}
	}
	for _, r := range p.Allow {
		if r.matches(host, addr, port) {
			return Decision{Allowed: true, Rule: r.Text, Reason: fmt.Sprintf("allowed by network.allow %q", r.Text)}
		}
	}
	if addr.IsValid() {
		return Decision{Reason: "raw addresses are denied unless an address rule allows them"}
	}
	return Decision{Reason: "no network.allow rule matches"}
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
// the cloud metadata services live), other metadata addresses, and the
// unspecified address.
func AlwaysDenied(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsUnspecified() {
		return true
	}
	for _, m := range metadata {
		if a == m {
			return true
		}
	}
	return false
}
