package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestGrants: the user's grants for a workspace (what allow --for always and
// deny --for always keep, made here with grants add) are merged into the
// rules of its next allowlist sandbox: an allow grant lets a request through
// the gateway that no profile rule allows, on its port only; a deny grant
// refuses a name the profile allows, and the 403 says how to undo it; the
// profile's network.deny still wins over an allow grant. The decision log
// names the grant that decided. Removed, a grant is gone at the next launch.
func TestGrants(t *testing.T) {
	s := newSandbox(t)
	// Its sandboxes' names are its own: another test's propio-workspace-2,
	// made at the same moment on the shared engine, had the same network
	// (Podman: "requested ip address ... is already allocated").
	s.uniqueWorkspace()
	in := newInternet(t)
	for _, args := range [][]string{
		{"allow", "allowed.test:80"},      // 1: no rule of the profile allows it
		{"deny", "wild.test"},             // 2: the profile allows it
		{"allow", "blocked.wild.test:80"}, // 3: the profile denies it
	} {
		if res := s.Run("", append([]string{"grants", "add"}, args...)...); res.Code != 0 {
			t.Fatalf("grants add %v:\n%s", args, res)
		}
	}
	res := s.Run("", "grants", "--json")
	var listed []struct{ File string }
	if err := json.Unmarshal([]byte(res.Stdout), &listed); err != nil || len(listed) != 3 {
		t.Fatalf("grants --json: %v\n%s", err, res)
	}
	file := listed[0].File
	if strings.HasPrefix(file, s.Workspace) {
		t.Fatalf("the grants file %s is in the workspace", file)
	}

	const profile = "network:\n  mode: allowlist\n  allow: [wild.test, \"*.wild.test\"]\n  deny: [blocked.wild.test]\n"
	r := startAllowlist(t, s, in, profile)

	for _, args := range [][]string{
		{"fetch", "http://allowed.test/g1"},
		{"fetch", "--no-proxy", "http://allowed.test/g2"},
		{"fetch", "--socks", "http://allowed.test/g3"},
		{"fetch", "http://sub.wild.test/g4"}, // the profile's wildcard: the deny grant names wild.test alone
	} {
		if out, ok := r.Probe(args...); !reached(out, ok) {
			t.Errorf("%v: want it through the gateway, got:\n%s", args, out)
		}
	}
	// The allow grant is for port 80 alone.
	if out, ok := r.Probe("fetch", "--timeout=5s", "http://allowed.test:443/g5"); reached(out, ok) || !strings.Contains(out, "status 403") {
		t.Errorf("allowed.test:443, which the grant does not name: want a 403, got:\n%s", out)
	}
	// The deny grant beats the profile's allow, on every way out.
	out, _ := r.Probe("fetch", "http://wild.test/d1")
	for _, want := range []string{"status 403", "grant:" + file + ":2", "grants rm 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("wild.test through the proxy: want a 403 with %q, got:\n%s", want, out)
		}
	}
	for _, args := range [][]string{{"fetch", "--socks", "http://wild.test/d2"}, {"fetch", "--no-proxy", "--timeout=3s", "http://wild.test/d3"}} {
		if out, ok := r.Probe(args...); reached(out, ok) {
			t.Errorf("%v reached wild.test:\n%s", args, out)
		}
	}
	// The profile's network.deny beats the allow grant.
	if out, _ := r.Probe("fetch", "http://blocked.wild.test/d4"); !strings.Contains(out, "status 403") || !strings.Contains(out, `network.deny "blocked.wild.test"`) {
		t.Errorf("blocked.wild.test: want the profile's deny rule to refuse it, got:\n%s", out)
	}
	if logs := in.Logs("beta"); strings.Contains(logs, "/d") {
		t.Errorf("the server saw a request the grants deny:\n%s", logs)
	}

	// The decision log names the grant that decided.
	all := decisions(t, s, false)
	for _, want := range []struct {
		via, host, rule string
		allowed         bool
	}{
		{"http", "allowed.test", "grant:" + file + ":1", true},
		{"socks5", "allowed.test", "grant:" + file + ":1", true},
		{"http", "wild.test", "grant:" + file + ":2", false},
		{"dns", "wild.test", "grant:" + file + ":2", false},
		{"http", "blocked.wild.test", "blocked.wild.test", false},
	} {
		found := false
		for _, e := range all {
			if e["via"] == want.via && e["host"] == want.host && e["allowed"] == want.allowed && e["rule"] == want.rule {
				found = true
			}
		}
		if !found {
			t.Errorf("no log entry via %s for %s allowed=%v by rule %s in:\n%v", want.via, want.host, want.allowed, want.rule, all)
		}
	}
	if res := r.Stop(); res.Code != 130 {
		t.Errorf("launcher after SIGINT: %s", res)
	}

	// Without the deny grant, the next launch lets the profile's rule decide.
	if res := s.Run("", "grants", "rm", "wild.test"); res.Code != 0 {
		t.Fatalf("grants rm:\n%s", res)
	}
	res = s.Run("", "run", "-p", s.Profile(profile), "--", "fetch", "http://wild.test/after")
	if res.Code != 0 || !strings.Contains(res.Stdout, "beta http wild.test /after") {
		t.Errorf("wild.test after grants rm:\n%s", res)
	}
}
