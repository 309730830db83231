package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	t.Parallel()
	good := map[string]Rule{
		"api.openrouter.ai":          {Host: "api.openrouter.ai"},
		"API.OpenRouter.AI.":         {Host: "api.openrouter.ai"},
		"*.amazonaws.com":            {Host: "amazonaws.com", Wildcard: true},
		"github.com:22":              {Host: "github.com", Port: 22},
		"host.docker.internal:11434": {Host: "host.docker.internal", Port: 11434},
		"localhost:8080":             {Host: "localhost", Port: 8080},
		"203.0.113.7":                {},
		"[2001:db8::1]:443":          {Port: 443},
		"2001:db8::1":                {},
	}
	for in, want := range good {
		got, err := ParseRule(in)
		if err != nil {
			t.Errorf("ParseRule(%q): %v", in, err)
			continue
		}
		if got.Host != want.Host || got.Wildcard != want.Wildcard || got.Port != want.Port || got.Text != in {
			t.Errorf("ParseRule(%q) = %+v, want %+v", in, got, want)
		}
	}
	bad := map[string]string{
		"":                    "empty",
		"*":                   "too broad",
		"*.com":               "too broad",
		"*.":                  "too broad",
		"a.*.example.com":     "may only start",
		"*example.com":        "may only start",
		"https://example.com": "no scheme or path",
		"example.com/path":    "no scheme or path",
		"example.com:0":       "1 to 65535",
		"example.com:70000":   "1 to 65535",
		"example.com:http":    "1 to 65535",
		"-bad.example.com":    "not a valid label",
		"exa mple.com":        "no scheme or path",
		"169.254.169.254":     "always denied",
		"[fe80::1]:80":        "always denied",
		"100.100.100.200":     "link-local and cloud metadata addresses are always denied",
		"127.0.0.1":           "loopback addresses are always denied",
		"127.1.2.3:8080":      "loopback addresses are always denied",
		"[::1]:22":            "loopback addresses are always denied",
		"::ffff:127.0.0.1":    "loopback addresses are always denied",
		"0.0.0.0":             "unspecified",
		"[::]:443":            "unspecified",
		"0.1.2.3":             "0.0.0.0/8",
		"example.com:2375":    "the container engine's API port is always denied",
		"*.example.com:2376":  "the container engine's API port is always denied",
		"203.0.113.7:2375":    "the container engine's API port is always denied",
		"[2001:db8::1":        "missing ]",
	}
	for in, want := range bad {
		if _, err := ParseRule(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRule(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	p, err := ParsePolicy(
		[]string{"api.openrouter.ai", "*.amazonaws.com", "github.com:22", "uploads.github.com", "203.0.113.7:8443"},
		[]string{"uploads.github.com", "*.evil.amazonaws.com"},
	)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		host    string
		port    uint16
		allowed bool
		rule    string
		reason  string
	}{
		{"api.openrouter.ai", 443, true, "api.openrouter.ai", "allowed by"},
		{"API.OPENROUTER.AI.", 80, true, "api.openrouter.ai", "allowed by"},
		{"api.openrouter.ai", 8080, false, "", "no network.allow rule"}, // no port: 80 and 443 only
		{"openrouter.ai", 443, false, "", "no network.allow rule"},
		{"s3.amazonaws.com", 443, true, "*.amazonaws.com", ""},
		{"a.b.amazonaws.com", 443, true, "*.amazonaws.com", ""},
		{"amazonaws.com", 443, false, "", ""}, // a wildcard is subdomains only
		{"notamazonaws.com", 443, false, "", ""},
		{"x.evil.amazonaws.com", 443, false, "*.evil.amazonaws.com", "denied by"}, // deny beats allow
		{"github.com", 22, true, "github.com:22", ""},
		{"github.com", 443, false, "", ""}, // host:port allows that port only
		{"uploads.github.com", 443, false, "uploads.github.com", "denied by"},
		{"203.0.113.7", 8443, true, "203.0.113.7:8443", ""},
		{"203.0.113.8", 443, false, "", "raw addresses"},
		{"169.254.169.254", 80, false, "", "always denied"},
		{"[fe80::1]", 443, false, "", "always denied"},
		{"100.100.100.200", 80, false, "", "always denied"},
		{"::ffff:169.254.169.254", 80, false, "", "always denied"},
		{"127.0.0.1", 8443, false, "", "loopback addresses are always denied"},
		{"[::1]", 443, false, "", "loopback addresses are always denied"},
		{"::ffff:127.0.0.1", 443, false, "", "loopback addresses are always denied"},
		{"0.0.0.0", 443, false, "", "the unspecified address and 0.0.0.0/8 are always denied"},
		{"api.openrouter.ai", 2375, false, "", "the container engine's API port is always denied"},
		{"s3.amazonaws.com", 2376, false, "", "the container engine's API port is always denied"},
		{"203.0.113.7", 2375, false, "", "the container engine's API port is always denied"},
		{"exa mple.com", 443, false, "", "not a valid host name"},
	}
	for _, tt := range tests {
		d := p.Decide(tt.host, tt.port)
		if d.Allowed != tt.allowed || d.Rule != tt.rule || !strings.Contains(d.Reason, tt.reason) {
			t.Errorf("Decide(%q, %d) = %+v, want allowed=%v rule=%q reason~%q", tt.host, tt.port, d, tt.allowed, tt.rule, tt.reason)
		}
		// Only the destinations no rule could allow say so.
		always := strings.Contains(tt.reason, "always denied") || strings.Contains(tt.reason, "not a valid host name")
		if d.AlwaysDenied != always {
			t.Errorf("Decide(%q, %d).AlwaysDenied = %v, want %v", tt.host, tt.port, d.AlwaysDenied, always)
		}
	}
}

// TestEngineAPIPortBeatsRules: even a policy that could name the engine's
// ports (rules built by hand, not parsed) cannot allow them.
func TestEngineAPIPortBeatsRules(t *testing.T) {
	t.Parallel()
	p := Policy{Allow: []Rule{{Text: "docker.test:2375", Host: "docker.test", Port: 2375}}}
	if d := p.Decide("docker.test", 2375); d.Allowed || !d.AlwaysDenied {
		t.Errorf("Decide(docker.test, 2375) = %+v, want always denied", d)
	}
}

func TestAlwaysDenied(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		"169.254.169.254": true, "fe80::1": true, "ff02::1": true, "100.100.100.200": true, "fd00:ec2::254": true,
		"127.0.0.1": true, "127.255.255.254": true, "::1": true, "::ffff:127.0.0.1": true,
		"0.0.0.0": true, "::": true, "0.255.0.1": true,
		"203.0.113.7": false, "10.0.0.1": false, "198.18.0.2": false, "2001:db8::1": false, "::2": false,
	} {
		a := netip.MustParseAddr(in)
		if got := AlwaysDenied(a); got != want {
			t.Errorf("AlwaysDenied(%s) = %v, want %v", in, got, want)
		}
		if got := AlwaysDeniedReason(a) != ""; got != want {
			t.Errorf("AlwaysDeniedReason(%s) = %q, want a reason: %v", in, AlwaysDeniedReason(a), want)
		}
	}
}

func TestParseBandwidth(t *testing.T) {
	t.Parallel()
	good := map[string]int64{
		"10mbit":    1_250_000,
		"8kbit":     1000,
		"8000bit":   1000,
		"1.5mbit":   187_500,
		"0.5gbit":   62_500_000,
		"1gbit":     125_000_000,
		"1000gbit":  MaxBandwidth,
		"100.0kbit": 12_500,
		"8001bit":   1000, // 1000.125 bytes, rounded down
	}
	for in, want := range good {
		t.Run(in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseBandwidth(in)
			if err != nil || got != want {
				t.Errorf("ParseBandwidth(%q) = %d, %v; want %d", in, got, err, want)
			}
		})
	}
	bad := map[string]string{
		"":                            "is not a rate",
		"10":                          "is not a rate",
		"mbit":                        "is not a rate",
		"10mb":                        "is not a rate",
		"10 mbit":                     "is not a rate",
		"10Mbit":                      "is not a rate",
		"10mbps":                      "is not a rate",
		"-1mbit":                      "is not a rate",
		"+1mbit":                      "is not a rate",
		"1e3kbit":                     "is not a rate",
		".5mbit":                      "is not a rate",
		"5.mbit":                      "is not a rate",
		"1.2.3mbit":                   "is not a rate",
		"10xbit":                      "is not a rate",
		"0mbit":                       "below the minimum rate of 8kbit",
		"7kbit":                       "below the minimum rate of 8kbit",
		"7999bit":                     "below the minimum rate of 8kbit",
		"1001gbit":                    "above the maximum",
		"99999999999999999999999gbit": "above the maximum",
	}
	for in, want := range bad {
		t.Run("bad "+in, func(t *testing.T) {
			t.Parallel()
			if got, err := ParseBandwidth(in); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("ParseBandwidth(%q) = %d, %v; want an error saying %q", in, got, err, want)
			} else if want == "is not a rate" && !strings.Contains(err.Error(), "bit, kbit, mbit or gbit") {
				t.Errorf("ParseBandwidth(%q): %v does not say the accepted form", in, err)
			}
		})
	}
}

func TestParsePolicyReportsEveryError(t *testing.T) {
	t.Parallel()
	_, err := ParsePolicy([]string{"ok.example.com", "*", "*.com"}, []string{"x:0"})
	if err == nil {
		t.Fatal("want errors")
	}
	for _, want := range []string{"allow[1]", "allow[2]", "deny[0]"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestSuggest(t *testing.T) {
	t.Parallel()
	for in, want := range map[[2]string]string{
		{"Example.COM.", "443"}: "example.com",
		{"example.com", "8080"}: "example.com:8080",
		{"2001:db8::1", "22"}:   "[2001:db8::1]:22",
	} {
		port := map[string]uint16{"443": 443, "8080": 8080, "22": 22}[in[1]]
		if got := Suggest(in[0], port); got != want {
			t.Errorf("Suggest(%q, %d) = %q, want %q", in[0], port, got, want)
		}
	}
}

// FuzzParseRule: no input may panic the parser, and whatever it accepts it
// can decide on.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"a.b", "*.a.b:1", "[::1]:2", "1.2.3.4", "*", "a:b:c", "[", "*.", ":", "\x00"} {
		f.Add(s, "host.example", uint16(443))
	}
	f.Fuzz(func(t *testing.T, rule, host string, port uint16) {
		r, err := ParseRule(rule)
		if err != nil {
			return
		}
		Policy{Allow: []Rule{r}}.Decide(host, port)
		Policy{Deny: []Rule{r}}.Decide(host, port)
	})
}

// FuzzParseBandwidth: no input panics, and an accepted rate is in range.
func FuzzParseBandwidth(f *testing.F) {
	for _, s := range []string{"10mbit", "1.5kbit", "8kbit", "0bit", "1e9gbit", ".bit", "9.9.9mbit"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBandwidth(s)
		if err == nil && (n < MinBandwidth || n > MaxBandwidth) {
			t.Errorf("ParseBandwidth(%q) = %d, out of range", s, n)
		}
	})
}

func TestGrants(t *testing.T) {
	t.Parallel()
	p, err := ParsePolicy([]string{"pypi.org", "*.example.test", "shared.test"}, []string{"bad.example.test"})
	if err != nil {
		t.Fatal(err)
	}
	const f = "grant:/c/grants/w.yaml:"
	for _, g := range []struct {
		deny    bool
		n, rule string
	}{
		{false, "1", "allowed.test:443"},
		{true, "2", "pypi.org"},
		{false, "3", "bad.example.test"},
		{true, "4", "api.example.test:443"},
		{false, "5", "shared.test"},
	} {
		if err := p.AddGrant(g.deny, f+g.n, g.rule); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.AddGrant(false, f+"6", "169.254.169.254"); err == nil || !strings.Contains(err.Error(), f+"6: ") {
		t.Fatalf("a grant of a metadata address = %v; want it refused, named", err)
	}
	for _, tt := range []struct {
		host    string
		port    uint16
		allowed bool
		rule    string
		reason  string
	}{
		{"allowed.test", 443, true, f + "1", `allowed by grant:/c/grants/w.yaml:1 "allowed.test:443"`},
		{"allowed.test", 80, false, "", "no network.allow rule matches"},                   // the grant's port only
		{"pypi.org", 443, false, f + "2", `denied by grant:/c/grants/w.yaml:2 "pypi.org"`}, // a deny grant beats the profile's allow
		{"bad.example.test", 443, false, "bad.example.test", `denied by network.deny`},     // the profile's deny beats an allow grant
		{"api.example.test", 443, false, f + "4", "denied by grant"},
		{"api.example.test", 80, true, "*.example.test", "allowed by network.allow"},
		{"shared.test", 443, true, "shared.test", "allowed by network.allow"}, // the profile's rule is named first
	} {
		d := p.Decide(tt.host, tt.port)
		if d.Allowed != tt.allowed || d.Rule != tt.rule || !strings.Contains(d.Reason, tt.reason) {
			t.Errorf("Decide(%s, %d) = %+v, want allowed=%v rule=%q reason~%q", tt.host, tt.port, d, tt.allowed, tt.rule, tt.reason)
		}
	}
}
