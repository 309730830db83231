package egress

import (
	"slices"
	"strings"
	"testing"
)

func TestMatchPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, path string
		want          bool
	}{
		{"/user", "/user", true},
		{"/user", "/user/", false},
		{"/user", "/users", false},
		{"/repos/*", "/repos/x", true},
		{"/repos/*", "/repos/x/y", false},
		{"/repos/*", "/repos/", true}, // an empty segment is a segment
		{"/repos/**", "/repos", true},
		{"/repos/**", "/repos/a/b/c", true},
		{"/repos/**", "/reposx", false},
		{"/**", "/anything/at/all", true},
		{"/**/info/refs", "/org/repo.git/info/refs", true},
		{"/**/info/refs", "/info/refs", true},
		{"/**/info/refs", "/org/info/refsx", false},
		{"/v1/*.json", "/v1/a.json", true},
		{"/v1/*.json", "/v1/a.jsonx", false},
		{"/v1/a*b*c", "/v1/abc", true},
		{"/v1/a*b*c", "/v1/axxbyyc", true},
		{"/v1/a*b*c", "/v1/acb", false},
		{"/v1/a*a", "/v1/a", false},
		{"/x", "x", false},
	}
	for _, tt := range tests {
		if got := MatchPath(tt.pattern, tt.path); got != tt.want {
			t.Errorf("MatchPath(%q, %q) = %v, want %v", tt.pattern, tt.path, got, tt.want)
		}
	}
}

func TestParseLimits(t *testing.T) {
	t.Parallel()
	r, _ := ParseRule("api.test")
	good := []struct{ methods, paths []string }{
		{[]string{"GET", "HEAD"}, nil},
		{nil, []string{"/repos/**", "/user"}},
		{[]string{"*"}, []string{"/v1/*"}},
		{[]string{"PROPFIND", "M-SEARCH"}, nil},
	}
	for _, g := range good {
		if _, err := r.WithLimits(g.methods, g.paths); err != nil {
			t.Errorf("WithLimits(%q, %q): %v", g.methods, g.paths, err)
		}
	}
	bad := map[string]struct {
		methods, paths []string
		want           string
	}{
		"lower case":      {[]string{"get"}, nil, "upper case"},
		"empty method":    {[]string{""}, nil, "empty method"},
		"any and more":    {[]string{"*", "GET"}, nil, "name no other"},
		"relative path":   {nil, []string{"repos"}, "must start with /"},
		"query":           {nil, []string{"/a?b=1"}, "no query"},
		"part of a **":    {nil, []string{"/a/b**"}, "whole segment"},
		"dot dot segment": {nil, []string{"/a/../b"}, "no . or .."},
	}
	for name, b := range bad {
		if _, err := r.WithLimits(b.methods, b.paths); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: WithLimits(%q, %q) = %v, want an error containing %q", name, b.methods, b.paths, err, b.want)
		}
	}
}

func TestFlagRule(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		methods, paths []string
		flag           string
	}{
		"no limits":        {nil, nil, "api.test:8443"},
		"methods":          {[]string{"GET", "HEAD"}, nil, "api.test:8443 GET,HEAD"},
		"paths":            {nil, []string{"/a/**", "/b"}, "api.test:8443 /a/** /b"},
		"any method":       {[]string{"*"}, []string{"/a"}, "api.test:8443 * /a"},
		"methods and path": {[]string{"POST"}, []string{"/graphql"}, "api.test:8443 POST /graphql"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, _ := ParseRule("api.test:8443")
			r, err := r.WithLimits(tt.methods, tt.paths)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Flag(); got != tt.flag {
				t.Fatalf("Flag() = %q, want %q", got, tt.flag)
			}
			back, err := ParseFlagRule(r.Flag())
			if err != nil {
				t.Fatal(err)
			}
			if back.Text != r.Text || back.Port != 8443 || !slices.Equal(back.Methods, r.Methods) || !slices.Equal(back.Paths, r.Paths) {
				t.Errorf("ParseFlagRule(%q) = %+v, want %+v", r.Flag(), back, r)
			}
		})
	}
	if _, err := ParseFlagRule("api.test get"); err == nil {
		t.Error("ParseFlagRule took a lower-case method")
	}
}

// limitedPolicy: GitHub's API read-only, its git paths for one
// organization, a host without limits, and a deny rule.
func limitedPolicy(t *testing.T, methods []string) Policy {
	t.Helper()
	p, err := ParsePolicy(nil, []string{"uploads.api.test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"api.test GET,HEAD", "git.test GET,POST /org/*/info/refs /org/*/git-upload-pack", "free.test", "*.api.test * /v1/**"} {
		r, err := ParseFlagRule(f)
		if err != nil {
			t.Fatal(err)
		}
		p.Allow = append(p.Allow, r)
	}
	p.Methods = methods
	return p
}

func TestDecideRequest(t *testing.T) {
	t.Parallel()
	p := limitedPolicy(t, nil)
	tests := []struct {
		host         string
		method, path string
		raw          string // the raw path, when it differs
		allowed      bool
		reason       string
	}{
		{"api.test", "GET", "/user", "", true, `allowed by network.allow "api.test"`},
		{"api.test", "HEAD", "/", "", true, ""},
		{"api.test", "POST", "/user", "", false, `network.allow "api.test" allows GET, HEAD only`},
		{"git.test", "POST", "/org/x/git-upload-pack", "", true, ""},
		{"git.test", "POST", "/org/x/git-receive-pack", "", false, `allows the paths /org/*/info/refs /org/*/git-upload-pack only`},
		{"git.test", "GET", "/other/x/info/refs", "", false, "allows the paths"},
		{"git.test", "DELETE", "/org/x/info/refs", "", false, "allows GET, POST only"},
		{"git.test", "GET", "/org/x/info/refs", "/org/x%2f../y/info/refs", false, "may be read differently"},
		{"git.test", "GET", "/org/x/info/refs", "/org//x/info/refs", false, "may be read differently"},
		{"git.test", "GET", "/org/x/info/refs", "/org/./x/info/refs", false, "may be read differently"},
		{"free.test", "DELETE", "/anything", "", true, ""},
		{"a.api.test", "PUT", "/v1/x", "", true, ""},
		{"a.api.test", "PUT", "/v2/x", "", false, `network.allow "*.api.test" allows the paths /v1/** only`},
		{"uploads.api.test", "GET", "/v1/x", "", false, `denied by network.deny "uploads.api.test"`},
		{"other.test", "GET", "/", "", false, "no network.allow rule matches"},
	}
	for _, tt := range tests {
		raw := tt.raw
		if raw == "" {
			raw = tt.path
		}
		d := p.DecideRequest(tt.host, 443, tt.method, tt.path, raw)
		if d.Allowed != tt.allowed || !strings.Contains(d.Reason, tt.reason) {
			t.Errorf("DecideRequest(%s %s%s) = %+v, want allowed %v, a reason with %q", tt.method, tt.host, raw, d, tt.allowed, tt.reason)
		}
		if !d.Allowed && strings.Contains(tt.reason, "allows") && !d.Request {
			t.Errorf("DecideRequest(%s %s%s) is not marked as a request's denial: %+v", tt.method, tt.host, raw, d)
		}
	}
}

// TestPolicyMethods: network.methods limits every rule that names no
// methods of its own; * is any; a rule's own methods win.
func TestPolicyMethods(t *testing.T) {
	t.Parallel()
	p := limitedPolicy(t, ReadOnlyMethods)
	tests := []struct {
		host, method, path string
		allowed            bool
		limited            bool
	}{
		{"free.test", "GET", "/", true, true},
		{"free.test", "OPTIONS", "/", true, true},
		{"free.test", "POST", "/", false, true},
		{"api.test", "OPTIONS", "/", false, true},      // its own GET, HEAD
		{"a.api.test", "DELETE", "/v1/x", true, true},  // its own *: limited by path only
		{"a.api.test", "DELETE", "/v2/x", false, true}, // and that path
		{"git.test", "POST", "/org/x/info/refs", true, true},
	}
	for _, tt := range tests {
		if d := p.DecideRequest(tt.host, 443, tt.method, tt.path, tt.path); d.Allowed != tt.allowed {
			t.Errorf("DecideRequest(%s %s) = %+v, want allowed %v", tt.method, tt.host, d, tt.allowed)
		}
		if got := p.Limited(tt.host, 443); got != tt.limited {
			t.Errorf("Limited(%s) = %v, want %v", tt.host, got, tt.limited)
		}
	}
}

// TestLimited: a destination is limited only when every allow rule that
// matches it is; one rule without limits lets every request through.
func TestLimited(t *testing.T) {
	t.Parallel()
	p := limitedPolicy(t, nil)
	tests := map[string]bool{
		"api.test":         true,
		"git.test":         true,
		"free.test":        false,
		"a.api.test":       true,
		"uploads.api.test": false, // denied: no request reaches a rule
		"other.test":       false,
	}
	for host, want := range tests {
		if got := p.Limited(host, 443); got != want {
			t.Errorf("Limited(%s) = %v, want %v", host, got, want)
		}
	}
	free, _ := ParseRule("api.test")
	p.Allow = append(p.Allow, free)
	if p.Limited("api.test", 443) {
		t.Error("api.test is limited although a rule without limits allows it")
	}
	if d := p.DecideRequest("api.test", 443, "DELETE", "/x", "/x"); !d.Allowed {
		t.Errorf("DELETE on api.test is denied although a rule without limits allows it: %+v", d)
	}
}

func TestCovers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		rule, host string
		port       uint16
		want       bool
	}{
		{"llm.test", "LLM.test.", 443, true},
		{"llm.test", "llm.test", 80, true},
		{"llm.test", "llm.test", 8443, false},
		{"llm.test:8443", "llm.test", 8443, true},
		{"*.llm.test", "a.llm.test", 443, true},
		{"*.llm.test", "llm.test", 443, false},
		{"203.0.113.7", "203.0.113.7", 443, true},
		{"203.0.113.7", "[203.0.113.7]", 443, true},
	}
	for _, tt := range tests {
		r, err := ParseRule(tt.rule)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Covers(tt.host, tt.port); got != tt.want {
			t.Errorf("%q.Covers(%s, %d) = %v, want %v", tt.rule, tt.host, tt.port, got, tt.want)
		}
	}
}
