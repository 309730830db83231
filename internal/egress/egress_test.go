package egress

import (
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
		{"exa mple.com", 443, false, "", "not a valid host name"},
	}
	for _, tt := range tests {
		d := p.Decide(tt.host, tt.port)
		if d.Allowed != tt.allowed || d.Rule != tt.rule || !strings.Contains(d.Reason, tt.reason) {
			t.Errorf("Decide(%q, %d) = %+v, want allowed=%v rule=%q reason~%q", tt.host, tt.port, d, tt.allowed, tt.rule, tt.reason)
		}
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
