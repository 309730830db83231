package egress

// Limits on the HTTP requests an allow rule lets through: its methods and
// its paths. A rule with limits is no longer decided per connection alone:
// the gateway must see each request (for HTTPS, by terminating TLS with the
// run's CA), and DecideRequest judges it.
//
// On the gateway's command line a rule with limits is one argument: the rule,
// then its methods joined by commas (none: the policy's), then its path
// patterns, separated by spaces (a URL path holds no space):
//
//	api.github.com GET,HEAD
//	github.com GET,POST /myorg/*/info/refs /myorg/*/git-upload-pack
//	api.example.test * /v1/**
//
// A path pattern starts with /; * matches within one segment, a whole
// segment ** matches any number of segments (none included). The query is
// never matched. "*" alone among the methods is any method.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// AnyMethod, as a rule's or the profile's only method, lets every method
// through.
const AnyMethod = "*"

// ReadOnlyMethods are the methods of "read-only web" (network.methods: [GET,
// HEAD, OPTIONS]).
var ReadOnlyMethods = []string{"GET", "HEAD", "OPTIONS"}

// ParseMethod checks one method name: an HTTP method in upper case (GET,
// PROPFIND), or AnyMethod.
func ParseMethod(m string) error {
	if m == AnyMethod {
		return nil
	}
	if m == "" {
		return errors.New("empty method")
	}
	for _, c := range m {
		if !(c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return fmt.Errorf("%q is not an HTTP method: write it in upper case, as GET or POST (or * for any)", m)
		}
	}
	return nil
}

// ParsePathPattern checks one path pattern.
func ParsePathPattern(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("%q is not a path: it must start with /", p)
	case strings.ContainsAny(p, "?# \t\r\n"):
		return fmt.Errorf("%q: a path pattern holds no query, fragment or space", p)
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if strings.Contains(seg, "**") && seg != "**" {
			return fmt.Errorf("%q: ** must be a whole segment, as in /repos/**", p)
		}
		if seg == "." || seg == ".." {
			return fmt.Errorf("%q: no . or .. segments", p)
		}
	}
	return nil
}

// WithLimits is r limited to methods and paths (either nil: any), after
// checking them.
func (r Rule) WithLimits(methods, paths []string) (Rule, error) {
	var errs []error
	for _, m := range methods {
		if err := ParseMethod(m); err != nil {
			errs = append(errs, err)
		}
	}
	if slices.Contains(methods, AnyMethod) && len(methods) > 1 {
		errs = append(errs, errors.New("* is any method: name no other beside it"))
	}
	for _, p := range paths {
		if err := ParsePathPattern(p); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return r, errors.Join(errs...)
	}
	r.Methods, r.Paths = slices.Clone(methods), slices.Clone(paths)
	return r, nil
}

// Flag is the rule as the gateway's command line takes it: its text, then
// its limits (see the package comment on limits).
func (r Rule) Flag() string {
	if len(r.Methods) == 0 && len(r.Paths) == 0 {
		return r.Text
	}
	out := []string{r.Text}
	if len(r.Methods) > 0 {
		out = append(out, strings.Join(r.Methods, ","))
	}
	return strings.Join(append(out, r.Paths...), " ")
}

// ParseFlagRule parses a rule as Flag writes it.
func ParseFlagRule(s string) (Rule, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return ParseRule(s)
	}
	r, err := ParseRule(fields[0])
	if err != nil || len(fields) == 1 {
		return r, err
	}
	var methods []string
	rest := fields[1:]
	if !strings.HasPrefix(rest[0], "/") {
		methods = strings.Split(rest[0], ",")
		rest = rest[1:]
	}
	return r.WithLimits(methods, rest)
}

// methodsOf are the methods rule r lets through, the policy's default
// methods when it names none: nil is any.
func (p Policy) methodsOf(r Rule) []string {
	m := r.Methods
	if len(m) == 0 {
		m = p.Methods
	}
	if len(m) == 1 && m[0] == AnyMethod {
		return nil
	}
	return m
}

// limited reports whether r lets some requests through and not others.
func (p Policy) limited(r Rule) bool { return len(p.methodsOf(r)) > 0 || len(r.Paths) > 0 }

// allowing are the allow rules that match host:port, unless it is denied.
func (p Policy) allowing(host string, port uint16) (Decision, []Rule) {
	d := p.Decide(host, port)
	if !d.Allowed {
		return d, nil
	}
	h, addr := normalHost(host)
	var rules []Rule
	for _, r := range p.Allow {
		if r.matches(h, addr, port) {
			rules = append(rules, r)
		}
	}
	return d, rules
}

// Limited reports whether the requests to host:port are limited by method
// or path: it is allowed, and every allow rule that matches it has limits
// (one without lets every request through). The gateway must then see each
// request, and DecideRequest judges it.
func (p Policy) Limited(host string, port uint16) bool {
	_, rules := p.allowing(host, port)
	if len(rules) == 0 {
		return false
	}
	for _, r := range rules {
		if !p.limited(r) {
			return false
		}
	}
	return true
}

// DecideRequest decides one HTTP request to host:port: Decide, then the
// method and the path (the request's path, without its query) against the
// limits of the allow rules that match; any of them may let it through.
// rawPath is the path as sent, percent-encoding and all: a path whose
// encoding servers read differently (an encoded slash, backslash or dot, a
// . or .. segment, an empty segment) is refused when paths are limited.
func (p Policy) DecideRequest(host string, port uint16, method, path, rawPath string) Decision {
	d, rules := p.allowing(host, port)
	if !d.Allowed {
		return d
	}
	var why []string
	for _, r := range rules {
		methods := p.methodsOf(r)
		switch {
		case len(methods) > 0 && !slices.Contains(methods, method):
			why = append(why, fmt.Sprintf("%s allows %s only", r.by("allow"), strings.Join(methods, ", ")))
		case len(r.Paths) > 0 && ambiguousPath(rawPath):
			why = append(why, fmt.Sprintf("%s limits paths, and %q may be read differently by the server (an encoded slash or dot, a . or .. or empty segment)", r.by("allow"), rawPath))
		case len(r.Paths) > 0 && !slices.ContainsFunc(r.Paths, func(pat string) bool { return MatchPath(pat, path) }):
			why = append(why, fmt.Sprintf("%s allows the paths %s only", r.by("allow"), strings.Join(r.Paths, " ")))
		default:
			return Decision{Allowed: true, Rule: r.Name(), Reason: "allowed by " + r.by("allow")}
		}
	}
	return Decision{Rule: rules[0].Name(), Reason: strings.Join(why, "; "), Request: true}
}

// ambiguousPath reports a raw path whose meaning depends on how a server
// decodes and normalizes it.
func ambiguousPath(raw string) bool {
	lower := strings.ToLower(raw)
	if strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") || strings.Contains(lower, "%2e") || strings.Contains(raw, "\\") {
		return true
	}
	if !strings.HasPrefix(raw, "/") {
		return true // "*" of OPTIONS *, or no path at all
	}
	segs := strings.Split(raw[1:], "/")
	for i, s := range segs {
		if s == "." || s == ".." || s == "" && i < len(segs)-1 {
			return true
		}
	}
	return false
}

// MatchPath reports whether path matches pattern (see ParsePathPattern):
// segment by segment, * within one, a ** segment over any number.
func MatchPath(pattern, path string) bool {
	if !strings.HasPrefix(path, "/") {
		return false
	}
	return matchSegments(strings.Split(pattern[1:], "/"), strings.Split(path[1:], "/"))
}

func matchSegments(pat, segs []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			rest := pat[1:]
			for i := 0; i <= len(segs); i++ {
				if matchSegments(rest, segs[i:]) {
					return true
				}
			}
			return false
		}
		if len(segs) == 0 || !matchSegment(pat[0], segs[0]) {
			return false
		}
		pat, segs = pat[1:], segs[1:]
	}
	return len(segs) == 0
}

// matchSegment matches one segment: * is any run of characters.
func matchSegment(pat, seg string) bool {
	parts := strings.Split(pat, "*")
	if len(parts) == 1 {
		return pat == seg
	}
	if !strings.HasPrefix(seg, parts[0]) {
		return false
	}
	seg = seg[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(seg, part)
		if i < 0 {
			return false
		}
		seg = seg[i+len(part):]
	}
	return strings.HasSuffix(seg, last)
}
