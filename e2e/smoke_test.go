package e2e

import (
	"strings"
	"testing"
)

// TestSmoke is the shortest proof that run works: the probe runs in the
// workspace, as the invoking user, and its exit code comes back.
func TestSmoke(t *testing.T) {
	s := newSandbox(t)
	p := s.Profile("network: {mode: none}\n")
	r := s.Run("", "run", "-p", p, "--", "id")
	if r.Code != 0 || !strings.Contains(r.Stdout, "cwd=/workspace") {
		t.Fatalf("want the probe's id from /workspace:\n%s", r)
	}
	if r := s.Run("", "-p", p, "--", "exit", "42"); r.Code != 42 {
		t.Fatalf("want exit 42:\n%s", r)
	}
}
