package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestPodmanAllowlistRefused: on Podman an allowlist sandbox is refused
// before anything is created. Podman 4.x gives the host an address on the
// sandbox's internal network (it ignores the bridge option that prevents
// it, and serves DNS there), so the sandbox could reach services of the host
// and resolve any name; until that is closed, allowlist runs on Docker only.
// CI runs this file's tests with DOCKER_HOST at Podman's socket.
func TestPodmanAllowlistRefused(t *testing.T) {
	s := newSandbox(t)
	if !testenv.EnginePodman(t) {
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

// TestPodmanServiceStarted: with --engine podman and no Podman API service
// listening on the socket CONTAINER_HOST names, the launcher starts `podman
// system service` there for the run and stops it afterwards.
func TestPodmanServiceStarted(t *testing.T) {
	s := newSandbox(t)
	if !testenv.EnginePodman(t) {
		t.Skip("the engine is Docker: .ci/run runs this test on Podman")
	}
	sock := filepath.Join(t.TempDir(), "podman.sock")
	s.Env = append(s.Env, "CONTAINER_HOST=unix://"+sock)
	p := s.Profile("network: {mode: none}\n")
	r := s.Run("", "--engine", "podman", "run", "-p", p, "--", "id")
	if r.Code != 0 || !strings.Contains(r.Stdout, "cwd=/workspace") {
		t.Fatalf("run through a service started for it:\n%s", r)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the service's socket is still there after the run (%v)", err)
	}
	out, _ := exec.Command("pgrep", "-f", "podman system service --time=0 unix://"+sock).Output()
	if strings.TrimSpace(string(out)) != "" {
		t.Errorf("the service started for the run still runs: pids %s", out)
	}
}
