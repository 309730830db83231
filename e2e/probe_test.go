package e2e

// Helpers shared by the scenario tests (isolation, env, terminal): run one
// probe command in a sandbox and judge its outcome.

import (
	"strings"
	"testing"
)

// probeOffline is the profile of tests that need no network.
const probeOffline = "network: {mode: none}\n"

// probeRun runs the probe command args in a sandbox of profile p.
func probeRun(s *sandbox, p string, args ...string) Result {
	s.t.Helper()
	return s.Run("", append([]string{"run", "-p", p, "--"}, args...)...)
}

// probeOK fails the test unless r ended with exit 0 and its stdout contains want.
func probeOK(t *testing.T, r Result, want string) {
	t.Helper()
	if r.Code != 0 || !strings.Contains(r.Stdout, want) {
		t.Fatalf("want exit 0 and %q on stdout:\n%s", want, r)
	}
}

// probeFails fails the test unless the probe's operation failed (exit 1) with
// want in its error.
func probeFails(t *testing.T, r Result, want string) {
	t.Helper()
	if r.Code != 1 || !strings.Contains(r.Stdout, "error: ") || !strings.Contains(r.Stdout, want) {
		t.Fatalf("want the probe to fail with %q:\n%s", want, r)
	}
}
