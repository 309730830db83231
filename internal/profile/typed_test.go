package profile_test

import (
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/profile"
)

// Sizes, durations, ports and the user are parsed once, when the profile
// is decoded: the resolved profile holds the values, and shows them as a
// profile would write them.
func TestTypedValues(t *testing.T) {
	t.Parallel()
	p, _ := resolve(t, map[string]string{"p.yaml": `image: a
user: "1000:100"
network: {mode: open}
resources: {memory: 1536m, tmp: 2g, timeout: 90m}
ports: ["3000", "127.0.0.1:8080-8081:80-81/udp"]
checks:
  - {name: quick, run: [id], timeout: 5s}
  - {name: default, run: [id]}
`}, "p.yaml")
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	r := p.Resources
	if r.Memory != 1536<<20 || r.Tmp != 2<<30 || time.Duration(r.Timeout) != 90*time.Minute {
		t.Errorf("resources memory %d tmp %d timeout %v", r.Memory, r.Tmp, time.Duration(r.Timeout))
	}
	if uid, gid := p.User.IDs(1, 2); uid != 1000 || gid != 100 || p.User.IsHost() || p.User.IsRoot() {
		t.Errorf("user %s: ids %d:%d", p.User, uid, gid)
	}
	if len(p.Ports) != 2 || len(p.Ports[0].Bindings) != 1 || p.Ports[0].Bindings[0].Target != 3000 || p.Ports[0].Bindings[0].HostIP != "" {
		t.Errorf("ports[0] %+v", p.Ports)
	}
	if b := p.Ports[1].Bindings; len(b) != 2 || b[0].Published != "8080" || b[1].Target != 81 || b[1].Protocol != "udp" || b[1].HostIP != "127.0.0.1" {
		t.Errorf("ports[1] bindings %+v", b)
	}
	if d := p.Checks[0].Deadline(); d != 5*time.Second {
		t.Errorf("checks[0] deadline %v", d)
	}
	if d := p.Checks[1].Deadline(); d != profile.DefaultCheckTimeout {
		t.Errorf("checks[1] deadline %v, want the default", d)
	}
	out, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"user: 1000:100\n", "memory: 1536m\n", "tmp: 2g\n", "timeout: 1h30m\n", "- \"3000\"\n", "- 127.0.0.1:8080-8081:80-81/udp\n", "timeout: 5s\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("shown profile lacks %q:\n%s", want, out)
		}
	}
}

func TestDefaultsAreTyped(t *testing.T) {
	t.Parallel()
	p, _ := resolve(t, map[string]string{"p.yaml": "image: a\n"}, "p.yaml")
	if !p.User.IsHost() || p.User.String() != "host" {
		t.Errorf("user %s, want host", p.User)
	}
	if p.Resources.Memory != profile.DefaultMemory || p.Resources.Tmp != profile.DefaultTmp || p.Resources.Timeout != 0 {
		t.Errorf("resources %+v", p.Resources)
	}
	if p.Resources.Idle.Duration() != time.Duration(profile.DefaultIdle) {
		t.Errorf("idle %v, want the default %v", p.Resources.Idle, profile.DefaultIdle)
	}
}

// resources.idle is a duration or off, typed once, shown as written.
func TestIdle(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		yaml string
		want time.Duration
		show string
	}{
		"duration": {yaml: "90s", want: 90 * time.Second, show: "idle: 1m30s\n"},
		"off":      {yaml: "off", want: 0, show: "idle: \"off\"\n"},
		"hours":    {yaml: "2h", want: 2 * time.Hour, show: "idle: 2h\n"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, _ := resolve(t, map[string]string{"p.yaml": "image: a\nresources: {idle: " + tc.yaml + "}\n"}, "p.yaml")
			if err := p.Check(); err != nil {
				t.Fatal(err)
			}
			if got := p.Resources.Idle.Duration(); got != tc.want || p.Resources.Idle.Off != (tc.yaml == "off") {
				t.Errorf("idle %v (off %v), want %v", got, p.Resources.Idle.Off, tc.want)
			}
			out, err := p.YAML()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(out), tc.show) {
				t.Errorf("shown profile lacks %q:\n%s", tc.show, out)
			}
		})
	}
}

func TestDurationString(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"90s": "1m30s", "30m": "30m", "2h": "2h", "1h30m": "1h30m", "1.5s": "1.5s", "500ms": "500ms"} {
		d, err := time.ParseDuration(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := profile.Duration(d).String(); got != want {
			t.Errorf("%s shows as %s, want %s", in, got, want)
		}
	}
}

func TestParseUser(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]struct {
		host, root bool
		uid, gid   int
	}{
		"host":   {host: true, uid: 7, gid: 8},
		"root":   {root: true},
		"0:1000": {root: true, gid: 1000},
		"1000:0": {uid: 1000},
	} {
		u, err := profile.ParseUser(in)
		if err != nil {
			t.Fatal(err)
		}
		uid, gid := u.IDs(7, 8)
		if u.IsHost() != want.host || u.IsRoot() != want.root || uid != want.uid || gid != want.gid || u.String() != in {
			t.Errorf("%s: host %v root %v ids %d:%d shown %s", in, u.IsHost(), u.IsRoot(), uid, gid, u)
		}
	}
	for _, bad := range []string{"", "bob", "1000", "1000:", ":1", "-1:2"} {
		if _, err := profile.ParseUser(bad); err == nil {
			t.Errorf("%q parsed as a user", bad)
		}
	}
}

// Egress rules and the bandwidth cap are parsed once, when the profile is
// decoded: the resolved profile holds the parsed rules (extends lists
// merged), each with its text as written, and shows them as written.
func TestTypedEgress(t *testing.T) {
	t.Parallel()
	p, _ := resolve(t, map[string]string{
		"base.yaml": "image: a\nnetwork:\n  mode: allowlist\n  allow: [API.Example.test]\n",
		"p.yaml": `extends: ./base.yaml
network:
  allow: ["*.cdn.test", "git.test:22", "[2001:db8::1]:443"]
  deny: [203.0.113.7]
  bandwidth: 1.5mbit
`}, "p.yaml")
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	n := p.Network
	var texts []string
	for _, r := range n.Allow {
		texts = append(texts, r.String())
	}
	if want := "API.Example.test *.cdn.test git.test:22 [2001:db8::1]:443"; strings.Join(texts, " ") != want {
		t.Errorf("allow %q, want %q", texts, want)
	}
	if len(n.Allow) == 4 {
		a := n.Allow
		if a[0].Host != "api.example.test" || a[0].Wildcard || a[0].Port != 0 {
			t.Errorf("allow[0] %+v", a[0].Rule)
		}
		if a[1].Host != "cdn.test" || !a[1].Wildcard {
			t.Errorf("allow[1] %+v", a[1].Rule)
		}
		if a[2].Host != "git.test" || a[2].Port != 22 {
			t.Errorf("allow[2] %+v", a[2].Rule)
		}
		if a[3].Addr.String() != "2001:db8::1" || a[3].Port != 443 || a[3].Host != "" {
			t.Errorf("allow[3] %+v", a[3].Rule)
		}
	}
	if len(n.Deny) != 1 || n.Deny[0].Addr.String() != "203.0.113.7" || n.Deny[0].Text != "203.0.113.7" {
		t.Errorf("deny %+v", n.Deny)
	}
	if !n.Bandwidth.IsSet() || n.Bandwidth.BytesPerSecond != 187_500 || n.Bandwidth.String() != "1.5mbit" {
		t.Errorf("bandwidth %+v", n.Bandwidth)
	}
	out, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"- API.Example.test\n", "- '*.cdn.test'\n", "- git.test:22\n", "- '[2001:db8::1]:443'\n", "- 203.0.113.7\n", "bandwidth: 1.5mbit\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("shown profile lacks %q:\n%s", want, out)
		}
	}
}

// A rule or rate that does not parse is kept with its error, which Check
// reports; no cap is the zero value.
func TestParseEgress(t *testing.T) {
	t.Parallel()
	if r, err := profile.ParseRule("*.com"); err == nil || r.Text != "*.com" {
		t.Errorf("*.com: %+v, %v", r, err)
	}
	if b, err := profile.ParseBandwidth(""); err != nil || b.IsSet() || b.BytesPerSecond != 0 {
		t.Errorf("no cap: %+v, %v", b, err)
	}
	if b, err := profile.ParseBandwidth("10mb"); err == nil || b.Text != "10mb" || !b.IsSet() {
		t.Errorf("10mb: %+v, %v", b, err)
	}
	if b, err := profile.ParseBandwidth("8kbit"); err != nil || b.BytesPerSecond != 1000 {
		t.Errorf("8kbit: %+v, %v", b, err)
	}
}
