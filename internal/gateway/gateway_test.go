package gateway

import (
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/egress"
)

// TestDenialHint: the hint names the destination, why it is denied, and the
// change to the profile that would allow it (a rule to add, a deny rule to
// remove), or says that none can.
func TestDenialHint(t *testing.T) {
	t.Parallel()
	const where = ".propio/sandbox.yaml:12"
	allow := []string{"api.test", "*.corp.test", "*.shop.test", "ssh.test:22"}
	deny := []string{"secret.corp.test", "*.pay.shop.test", "card.pay.shop.test", "evil.test"}
	tests := map[string]struct {
		profile string
		host    string
		port    uint16
		want    string // the whole hint
	}{
		"no rule for a name": {
			host: "other.test", port: 443,
			want: "propio-sandbox gateway: other.test is not allowed (no network.allow rule matches).\n" +
				"To allow it, add to network.allow (" + where + "):\n    - \"other.test\"\n",
		},
		"no rule for a port": {
			host: "api.test", port: 8443,
			want: "propio-sandbox gateway: api.test:8443 is not allowed (no network.allow rule matches).\n" +
				"To allow it, add to network.allow (" + where + "):\n    - \"api.test:8443\"\n",
		},
		"no profile location": {
			profile: "-", host: "other.test", port: 80,
			want: "propio-sandbox gateway: other.test is not allowed (no network.allow rule matches).\n" +
				"To allow it, add to network.allow (the profile):\n    - \"other.test\"\n",
		},
		"a raw address": {
			host: "203.0.113.7", port: 443,
			want: "propio-sandbox gateway: 203.0.113.7 is not allowed (raw addresses are denied unless an address rule allows them).\n" +
				"To allow it, add an address rule to network.allow (" + where + "):\n    - \"203.0.113.7\"\n",
		},
		"a raw IPv6 address on a port": {
			host: "2001:db8::7", port: 22,
			want: "propio-sandbox gateway: [2001:db8::7]:22 is not allowed (raw addresses are denied unless an address rule allows them).\n" +
				"To allow it, add an address rule to network.allow (" + where + "):\n    - \"[2001:db8::7]:22\"\n",
		},
		"a deny rule over an allow rule": {
			host: "secret.corp.test", port: 443,
			want: "propio-sandbox gateway: secret.corp.test is not allowed: it is denied by network.deny \"secret.corp.test\" in " + where + ".\n" +
				"Removing that deny rule would allow it (network.allow \"*.corp.test\" matches).\n",
		},
		"two deny rules": {
			host: "card.pay.shop.test", port: 443,
			want: "propio-sandbox gateway: card.pay.shop.test is not allowed: it is denied by network.deny \"*.pay.shop.test\" and \"card.pay.shop.test\" in " + where + ".\n" +
				"Removing those deny rules would allow it (network.allow \"*.shop.test\" matches).\n",
		},
		"a deny rule and no allow rule": {
			host: "evil.test", port: 443,
			want: "propio-sandbox gateway: evil.test is not allowed: it is denied by network.deny \"evil.test\" in " + where + ".\n" +
				"To allow it, remove that deny rule and add to network.allow (" + where + "):\n    - \"evil.test\"\n",
		},
		"metadata": {
			host: "169.254.169.254", port: 80,
			want: "propio-sandbox gateway: 169.254.169.254 is not allowed (link-local and cloud metadata addresses are always denied).\n" +
				"It can never be allowed: no rule in " + where + " can change that.\n",
		},
		"loopback": {
			host: "127.0.0.1", port: 8080,
			want: "propio-sandbox gateway: 127.0.0.1:8080 is not allowed (loopback addresses are always denied, since in the gateway loopback is the gateway itself).\n" +
				"It can never be allowed: no rule in " + where + " can change that.\n",
		},
		"the engine's API port": {
			host: "ssh.test", port: 2376,
			want: "propio-sandbox gateway: ssh.test:2376 is not allowed (the container engine's API port is always denied, on any host).\n" +
				"It can never be allowed: no rule in " + where + " can change that.\n",
		},
		// A built-in profile cannot be edited: the hint gives the command
		// that makes one of the user's own extending it, and the lines.
		"under a built-in": {
			profile: "builtin:strict:55", host: "pypi.test", port: 443,
			want: "propio-sandbox gateway: pypi.test is not allowed (no network.allow rule matches).\n" +
				"To allow it, make a profile of your own that extends the built-in strict (builtin:strict:55 cannot be edited):\n" +
				"    propio-sandbox init --extends strict\n" +
				"then add these lines to the .propio/sandbox.yaml it writes, and run `propio-sandbox trust`:\n" +
				"    network:\n      allow:\n        - \"pypi.test\"\n",
		},
		"a raw address under a built-in": {
			profile: "builtin:standard:40", host: "203.0.113.7", port: 443,
			want: "propio-sandbox gateway: 203.0.113.7 is not allowed (raw addresses are denied unless an address rule allows them).\n" +
				"To allow it, make a profile of your own that extends the built-in standard (builtin:standard:40 cannot be edited):\n" +
				"    propio-sandbox init --extends standard\n" +
				"then add these lines to the .propio/sandbox.yaml it writes, and run `propio-sandbox trust`:\n" +
				"    network:\n      allow:\n        - \"203.0.113.7\"\n",
		},
		// A user's profile whose allow list is all inherited: the lines to
		// add to it.
		"a file without an allow list": {
			profile: "/home/me/mine.yaml", host: "pypi.test", port: 443,
			want: "propio-sandbox gateway: pypi.test is not allowed (no network.allow rule matches).\n" +
				"To allow it, add these lines to /home/me/mine.yaml (allow: under its network: section, if it has one):\n" +
				"    network:\n      allow:\n        - \"pypi.test\"\n",
		},
		// The user's deny grant: remove it (a restart reads the grants).
		"a deny grant": {
			host: "api.test", port: 443,
			want: "propio-sandbox gateway: api.test is not allowed (denied by grant:/c/grants/w.yaml:2 \"api.test\").\n" +
				"You denied it for good: grant 2 in /c/grants/w.yaml.\n" +
				"To allow it, run `propio-sandbox grants rm 2` in the workspace, and start the sandbox again.\n",
		},
		"an allow grant": {
			host: "granted.test", port: 8443,
			want: "propio-sandbox gateway: granted.test:8443 is allowed (allowed by grant:/c/grants/w.yaml:1 \"granted.test:8443\").\n",
		},
		"allowed": {
			host: "ssh.test", port: 22,
			want: "propio-sandbox gateway: ssh.test:22 is allowed (allowed by network.allow \"ssh.test:22\").\n",
		},
	}
	p := mustPolicy(t, allow...)
	p.Deny = mustPolicy(t, deny...).Allow
	if err := p.AddGrant(false, "grant:/c/grants/w.yaml:1", "granted.test:8443"); err != nil {
		t.Fatal(err)
	}
	if err := p.AddGrant(true, "grant:/c/grants/w.yaml:2", "api.test"); err != nil {
		t.Fatal(err)
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := &Config{Policy: p, Profile: where}
			switch tt.profile {
			case "":
			case "-":
				c.Profile = ""
			default:
				c.Profile = tt.profile
			}
			if got := c.DenialHint(tt.host, tt.port); got != tt.want {
				t.Errorf("DenialHint(%q, %d):\n%s\nwant:\n%s", tt.host, tt.port, got, tt.want)
			}
		})
	}
}

// TestDenialHintNamesWhatTheClientAsked: the hint quotes the destination as
// the rule to write, normalised, so it can be pasted into the profile.
func TestDenialHintNamesWhatTheClientAsked(t *testing.T) {
	t.Parallel()
	c := &Config{Profile: "p.yaml"}
	if got := c.DenialHint("Other.TEST.", 443); !strings.Contains(got, `- "other.test"`) {
		t.Errorf("hint %q, want the rule other.test", got)
	}
}

func TestDenialHintNamesTheDenyList(t *testing.T) {
	t.Parallel()
	p, err := egress.ParsePolicy([]string{"*.corp.test"}, []string{"secret.corp.test"})
	if err != nil {
		t.Fatal(err)
	}
	c := &Config{Policy: p, Profile: "sandbox.yaml:12", DenyAt: "sandbox.yaml:15"}
	got := c.DenialHint("secret.corp.test", 443)
	if !strings.Contains(got, `denied by network.deny "secret.corp.test" in sandbox.yaml:15`) {
		t.Errorf("hint %q does not point at network.deny's line", got)
	}
	if got := c.DenialHint("other.test", 443); !strings.Contains(got, "network.allow (sandbox.yaml:12)") {
		t.Errorf("hint %q does not point at network.allow's line", got)
	}
}
