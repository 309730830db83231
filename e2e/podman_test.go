package e2e

import (
	"strings"
	"testing"
)

// TestPodmanAllowlistRefused: on Podman an allowlist sandbox is refused
// before anything is created. Podman 4.x gives the host an address on the
// sandbox's internal network (it ignores the bridge option that prevents
// it, and serves DNS there), so the sandbox could reach services of the host
// and resolve any name; until that is closed, allowlist runs on Docker only.
// CI runs this file's tests with DOCKER_HOST at Podman's socket.
func TestPodmanAllowlistRefused(t *testing.T) {
	s := newSandbox(t)
	if !enginePodman(t) {
		t.Skip("the engine is Docker: .ci/run runs this test on Podman")
	}
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")
	r := s.Run("", "run", "-p", p, "--", "id")
	if r.Code != 1 || !strings.Contains(r.Stderr, "allowlist does not run on Podman") || !strings.Contains(r.Stderr, "--engine docker") {
		t.Fatalf("want a refusal that says why and what to use instead:\n%s", r)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
