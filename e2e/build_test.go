package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuild: `build` makes a profile's image from its build section, showing
// the build's progress, and `run --build` builds before it runs; the image
// did not exist before, so nothing could have been pulled.
func TestBuild(t *testing.T) {
	s := newSandbox(t)
	image := "propio-sandbox-e2e/built:" + randomID()
	t.Cleanup(func() { docker("image", "rm", "-f", image) })

	dir := t.TempDir()
	dockerfile := "FROM " + ProbeImage + "\nLABEL dev.propio-sandbox.e2e=build\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	p := s.Profile("image: " + image + "\nbuild: {context: " + dir + "}\nnetwork: {mode: none}\n")

	// Missing at first: run says how to build it.
	r := s.Run("", "run", "-p", p, "--", "exit", "0")
	if r.Code != 3 || !strings.Contains(r.Stderr, "preflight check image failed") || !strings.Contains(r.Stderr, image) || !strings.Contains(r.Stderr, "propio-sandbox build -p "+p) {
		t.Fatalf("want the missing image named with the command that builds it:\n%s", r)
	}

	r = s.Run("", "build", "-p", p)
	if r.Code != 0 || !strings.Contains(r.Stdout, "built "+image) {
		t.Fatalf("build failed:\n%s", r)
	}
	if !strings.Contains(r.Stdout+r.Stderr, "Step 2/") && !strings.Contains(r.Stdout+r.Stderr, "LABEL") {
		t.Errorf("want the build's progress shown:\n%s", r)
	}
	if out, err := docker("image", "inspect", "--format", "{{index .Config.Labels \"dev.propio-sandbox.e2e\"}}", image); err != nil || strings.TrimSpace(out) != "build" {
		t.Fatalf("the built image is not there: %v %s", err, out)
	}
	if r := s.Run("", "-p", p, "--", "id"); r.Code != 0 || !strings.Contains(r.Stdout, "cwd=/workspace") {
		t.Fatalf("running the built image:\n%s", r)
	}

	// run --build builds it again, then runs.
	docker("image", "rm", "-f", image)
	if r := s.Run("", "run", "--build", "-p", p, "--", "exit", "5"); r.Code != 5 {
		t.Fatalf("run --build:\n%s", r)
	}
}

// TestNoDockerCLI: only the engine socket is needed; no docker or compose
// binary is on PATH for the launcher.
func TestNoDockerCLI(t *testing.T) {
	s := newSandbox(t)
	empty := t.TempDir()
	for i, kv := range s.Env {
		if strings.HasPrefix(kv, "PATH=") {
			s.Env[i] = "PATH=" + empty
		}
	}
	p := s.Profile("network: {mode: open}\n")
	if r := s.Run("", "-p", p, "--", "exit", "9"); r.Code != 9 {
		t.Fatalf("want the sandbox's exit 9 with nothing on PATH:\n%s", r)
	}
}
