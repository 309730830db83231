package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeclaredChecks: a profile's own checks run, each in a throwaway
// sandbox of the profile, before the agent: one that fails stops run with
// exit 3, its name and output, and the agent never starts; one that passes
// lets it start; --skip-checks skips a declared check, never a built-in one.
func TestDeclaredChecks(t *testing.T) {
	s := newSandbox(t)
	marker := filepath.Join(s.Workspace, "agent-ran")
	agent := []string{"--", "write", "agent-ran", "yes"}
	profileWith := func(checks string) string {
		return s.Profile("network: {mode: none}\nchecks:\n" + checks)
	}
	failing := profileWith("  - {name: token file present, run: [read, /no/such/token]}\n  - {name: never reached, run: [id]}\n")

	t.Run("a failing check stops run", func(t *testing.T) {
		r := s.Run("", append([]string{"run", "-p", failing}, agent...)...)
		if r.Code != 3 || !strings.Contains(r.Stderr, `preflight check token file present failed`) ||
			!strings.Contains(r.Stderr, "/no/such/token") || !strings.Contains(r.Stderr, "--skip-checks") {
			t.Fatalf("want exit 3 naming the check, with its output and the skip hint:\n%s", r)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the agent ran although a check failed")
		}
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	})
	t.Run("a passing check lets the agent start", func(t *testing.T) {
		p := profileWith("  - {name: probe answers, run: [id], timeout: 20s}\n")
		r := s.Run("", append([]string{"run", "-p", p}, agent...)...)
		if r.Code != 0 {
			t.Fatalf("run:\n%s", r)
		}
		if _, err := os.Stat(marker); err != nil {
			t.Fatalf("the agent did not run: %v", err)
		}
		os.Remove(marker)
	})
	t.Run("a check that hangs runs out of time", func(t *testing.T) {
		p := profileWith("  - {name: slow, run: [sleep, 1m], timeout: 2s}\n")
		r := s.Run("", append([]string{"run", "-p", p}, agent...)...)
		if r.Code != 3 || !strings.Contains(r.Stderr, "did not finish within 2s") {
			t.Fatalf("want exit 3 after the check's timeout:\n%s", r)
		}
	})
	t.Run("--skip-checks", func(t *testing.T) {
		r := s.Run("", append([]string{"run", "-p", failing, "--skip-checks", "token file present"}, agent...)...)
		if r.Code != 0 {
			t.Fatalf("run with the failing check skipped:\n%s", r)
		}
		os.Remove(marker)
		for _, bad := range []string{"engine", "no such check"} {
			r := s.Run("", append([]string{"run", "-p", failing, "--skip-checks", bad}, agent...)...)
			if r.Code != 2 {
				t.Errorf("--skip-checks %q: want a usage error (exit 2):\n%s", bad, r)
			}
		}
	})
	t.Run("doctor runs them all", func(t *testing.T) {
		r := s.Run("", "doctor", "-p", failing)
		if r.Code != 1 || !strings.Contains(r.Stdout, "token file present") || !strings.Contains(r.Stdout, "never reached") {
			t.Fatalf("doctor:\n%s", r)
		}
	})
}

// TestDeclaredCheckThroughTheAllowlist: a declared check runs behind the
// profile's gateway, so one that reaches for a host the allowlist denies
// fails with the gateway's reason.
func TestDeclaredCheckThroughTheAllowlist(t *testing.T) {
	s := newSandbox(t)
	in := newInternet(t)
	s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
	// The checks wait longer than the probe's 5 s: the first request
	// through a gateway just started, on a machine loaded by the other
	// tests (a cluster's among them), took longer in CI.
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\nchecks:\n" +
		"  - {name: allowed api answers, run: [fetch, --timeout, 20s, --fail, \"http://allowed.test/ok\"]}\n" +
		"  - {name: denied api answers, run: [fetch, --timeout, 20s, --fail, \"http://denied.test/key\"]}\n")
	r := s.Run("", "run", "-p", p, "--", "id")
	if r.Code != 3 || !strings.Contains(r.Stderr, "preflight check denied api answers failed") ||
		!strings.Contains(r.Stderr, "denied.test is not allowed (no network.allow rule matches)") {
		t.Fatalf("want the denied check to fail with the gateway's reason:\n%s", r)
	}
	if !strings.Contains(in.Logs("alpha"), "/ok") {
		t.Errorf("the allowed check did not reach its server:\n%s", in.Logs("alpha"))
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
