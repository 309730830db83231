package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// forkScript forks up to 64 children that sleep a moment, and says how
// many it made and why it stopped.
const forkScript = `import os, time
pids = []
try:
    while len(pids) < 64:
        pid = os.fork()
        if pid == 0:
            time.sleep(2)
            os._exit(0)
        pids.append(pid)
except OSError as e:
    print("stopped:", e.strerror)
print("forks=%d" % len(pids))
for pid in pids:
    os.waitpid(pid, 0)
`

// TestResourceLimitsEnforcedOrWarned: a profile's pids limit holds (forks
// past it fail inside), or, on an engine that cannot enforce limits (a
// rootless engine on cgroups v1, as .ci/run's rootless pass has it), the
// launcher says so on the launch, and it is true: the forks go past it.
func TestResourceLimitsEnforcedOrWarned(t *testing.T) {
	s := newSandbox(t)
	ignored := engineIgnoresLimits(t)
	p := s.Profile("image: propio-sandbox/agent:latest\nnetwork: {mode: none}\nresources: {pids: 32}\n")
	r := s.Run("", "run", "-p", p, "--", "python3", "-c", forkScript)
	m := regexp.MustCompile(`forks=(\d+)`).FindStringSubmatch(r.Stdout)
	if r.Code != 0 || m == nil {
		t.Fatalf("the fork script did not run to its end:\n%s", r)
	}
	forks, _ := strconv.Atoi(m[1])
	warned := strings.Contains(r.Stderr, "limits are not enforced")
	switch {
	case ignored && (!warned || forks < 64):
		t.Errorf("on a rootless engine on cgroups v1: warned %v, %d forks past a limit of 32 (want the warning, and 64: the limit is not enforced, as it says):\n%s", warned, forks, r)
	case !ignored && (warned || forks >= 32):
		t.Errorf("warned %v, %d forks under a pids limit of 32 (want no warning, and the limit to stop them):\n%s", warned, forks, r)
	}
	t.Logf("limits ignored by the engine: %v; %d forks; warned: %v", ignored, forks, warned)
}

// engineIgnoresLimits reports whether the tests' engine cannot enforce a
// container's resource limits: a rootless engine on cgroups v1.
func engineIgnoresLimits(t *testing.T) bool {
	t.Helper()
	cgroups, err := docker("info", "--format", "{{.CgroupVersion}}")
	if err != nil {
		t.Fatalf("the engine's cgroups version: %v", err)
	}
	return engineRootless(t) && strings.TrimSpace(cgroups) == "1"
}
