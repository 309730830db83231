package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestDockerContext: a Docker engine of the test's own is reached through
// a docker context made in a DOCKER_CONFIG of the test's own, as the docker
// CLI chooses one: DOCKER_CONTEXT, the config file's current context, and
// --context, which beats DOCKER_HOST. The sandbox runs there (its container,
// with its labels, is on that engine and not on the tests' one), doctor
// names the engine, context and host, and a context that does not exist is
// a clear error naming where it was looked for, leaving nothing behind.
func TestDockerContext(t *testing.T) {
	s := newSandbox(t)
	if testenv.EnginePodman(t) {
		t.Skip("starts a Docker engine of the test's own; the Podman pass has no docker contexts to test")
	}
	e := testenv.PrivateDocker(t, ProbeImage)
	cfg := t.TempDir()
	dockerCLI := func(args ...string) {
		t.Helper()
		cmd := exec.Command("docker", args...)
		cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+cfg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("docker %v: %v: %s", args, err, out)
		}
	}
	dockerCLI("context", "create", "private", "--description", "the test's own engine", "--docker", "host="+e.Host)
	p := s.Profile("network: {mode: none}\n")
	// The launcher's environment without DOCKER_HOST, which would beat
	// DOCKER_CONTEXT and the current context.
	noHost := slices.DeleteFunc(slices.Clone(s.Env), func(kv string) bool { return strings.HasPrefix(kv, "DOCKER_HOST=") })
	base := slices.Concat(noHost, []string{"DOCKER_CONFIG=" + cfg})
	label := "label=dev.propio-sandbox.workspace=" + s.Workspace

	t.Run("DOCKER_CONTEXT", func(t *testing.T) {
		s.Env = append(slices.Clone(base), "DOCKER_CONTEXT=private")
		l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
		l.waitStdout(t, "ready", 2*time.Minute)
		// All states: the engine may list the container as created for a
		// moment after its process has started (and said ready).
		out, err := e.Docker("ps", "-aq", "--filter", label)
		if err != nil {
			t.Fatal(err)
		}
		if len(strings.Fields(out)) != 1 {
			all, _ := e.Docker("ps", "-a", "--format", "{{.Names}} {{.Status}} {{.Labels}}")
			t.Errorf("the context's engine runs %d containers of the sandbox, want 1; it has:\n%s", len(strings.Fields(out)), all)
		}
		out, err = docker("ps", "-aq", "--filter", label)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) != "" {
			t.Errorf("the tests' engine has containers of the sandbox: %s", out)
		}
		l.signal(t, syscall.SIGTERM)
		if r := l.wait(t, time.Minute); r.Code != 143 {
			t.Errorf("the sandbox ended with %d, want 143:\n%s", r.Code, r)
		}
		s.WaitBackground()
		if left := privateLeftovers(t, e, s.Workspace); len(left) > 0 {
			t.Errorf("left on the context's engine: %v", left)
		}
	})

	t.Run("current context", func(t *testing.T) {
		dockerCLI("context", "use", "private")
		t.Cleanup(func() { dockerCLI("context", "use", "default") })
		s.Env = slices.Clone(base)
		r := s.Run("", "doctor", "-p", p)
		if r.Code != 0 {
			t.Fatalf("doctor:\n%s", r)
		}
		want := `reachable: docker ` // then the version
		line := doctorLine(r.Stdout, "engine")
		for _, w := range []string{want, "at " + e.Host, `(context "private", from ` + filepath.Join(cfg, "config.json") + ")"} {
			if !strings.Contains(line, w) {
				t.Errorf("doctor's engine line does not say %q: %s", w, line)
			}
		}
	})

	t.Run("--context beats DOCKER_HOST", func(t *testing.T) {
		s.Env = append(slices.Clone(base), "DOCKER_HOST=unix://"+engineSocket(t))
		r := s.Run("", "--context", "private", "doctor", "-p", p)
		if r.Code != 0 {
			t.Fatalf("doctor:\n%s", r)
		}
		if line := doctorLine(r.Stdout, "engine"); !strings.Contains(line, "at "+e.Host+` (context "private", from --context)`) {
			t.Errorf("doctor's engine line: %s", line)
		}
		r = s.Run("", "--context", "private", "run", "-p", p, "--", "exit", "7")
		if r.Code != 7 {
			t.Errorf("run --context private: exit %d, want 7:\n%s", r.Code, r)
		}
		r = s.Run("", "--engine", "podman", "--context", "private", "run", "-p", p, "--", "exit", "0")
		if r.Code != 2 || !strings.Contains(r.Stderr, "--context private names a Docker context, and --engine podman is not Docker") {
			t.Errorf("--engine podman --context private:\n%s", r)
		}
		s.WaitBackground()
		if left := privateLeftovers(t, e, s.Workspace); len(left) > 0 {
			t.Errorf("left on the context's engine: %v", left)
		}
	})

	t.Run("missing context", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			env  []string
			args []string
			says []string
		}{
			{"DOCKER_CONTEXT", []string{"DOCKER_CONTEXT=gone"}, nil, []string{`docker context "gone" (named by DOCKER_CONTEXT) does not exist in ` + filepath.Join(cfg, "contexts"), "hint: set DOCKER_CONTEXT to an existing one"}},
			{"--context", nil, []string{"--context", "gone"}, []string{`docker context "gone" (named by --context) does not exist in ` + filepath.Join(cfg, "contexts")}},
			{"current", []string{}, nil, []string{`docker context "gone" (the current context of ` + filepath.Join(cfg, "config.json") + ") does not exist", "docker context use NAME"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tc.name == "current" {
					if err := os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{"currentContext": "gone"}`), 0o600); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{}`), 0o600) })
				}
				s.Env = append(slices.Clone(base), tc.env...)
				r := s.Run("", append(tc.args, "run", "-p", p, "--", "exit", "0")...)
				if r.Code == 0 {
					t.Fatalf("run with a missing context succeeded:\n%s", r)
				}
				for _, w := range tc.says {
					if !strings.Contains(r.Stderr, w) {
						t.Errorf("the error does not say %q:\n%s", w, r.Stderr)
					}
				}
				r = s.Run("", append(tc.args, "doctor", "-p", p)...)
				if line := doctorLine(r.Stdout, "engine"); r.Code == 0 || !strings.Contains(line, `docker context "gone"`) {
					t.Errorf("doctor with a missing context:\n%s", r)
				}
				if left := privateLeftovers(t, e, s.Workspace); len(left) > 0 {
					t.Errorf("left on the context's engine: %v", left)
				}
			})
		}
	})

	t.Run("engine down", func(t *testing.T) {
		down := "unix://" + filepath.Join(t.TempDir(), "docker.sock")
		dockerCLI("context", "create", "down", "--docker", "host="+down)
		s.Env = append(slices.Clone(base), "DOCKER_CONTEXT=down")
		r := s.Run("", "run", "-p", p, "--", "exit", "0")
		if r.Code == 0 || !strings.Contains(r.Stderr, `docker context "down" (from DOCKER_CONTEXT): `) || !strings.Contains(r.Stderr, strings.TrimPrefix(down, "unix://")) {
			t.Errorf("run on a context whose engine is down does not name the context and its host:\n%s", r)
		}
	})
	s.Env = noHost
}

// doctorLine is the line of doctor's table for the check name.
func doctorLine(table, name string) string {
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return line
		}
	}
	return ""
}
