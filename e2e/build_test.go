package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuild: the first run of a profile whose image is missing builds it
// from the profile's build section, showing the build's steps (on standard
// error: standard output is the sandbox's), with no docker CLI or buildx
// plugin and no warning about one; `build` builds it again, and `run
// --build` builds before it runs. The image did not exist before, so
// nothing could have been pulled.
func TestBuild(t *testing.T) {
	s := newSandbox(t)
	image := "propio-sandbox-e2e/built:" + randomID()
	t.Cleanup(func() { docker("image", "rm", "-f", image) })
	empty := t.TempDir()
	for i, kv := range s.Env {
		if strings.HasPrefix(kv, "PATH=") {
			s.Env[i] = "PATH=" + empty
		}
	}

	dir := t.TempDir()
	dockerfile := "FROM " + ProbeImage + "\nLABEL dev.propio-sandbox.e2e=build\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	p := s.Profile("image: " + image + "\nbuild: {context: " + dir + "}\nnetwork: {mode: none}\n")

	// Missing at first: run builds it, then runs it.
	r := s.Run("", "run", "-p", p, "--", "id")
	if r.Code != 0 || !strings.Contains(r.Stderr, image+" is not on the engine: building it first") || !buildStepShown(r.Stderr) {
		t.Fatalf("want the first run to build the image, showing its steps:\n%s", r)
	}
	if strings.Contains(strings.ToLower(r.Stdout), "step ") || !strings.Contains(r.Stdout, "cwd=/workspace") {
		t.Errorf("want only the sandbox's output on standard output:\n%s", r)
	}
	if strings.Contains(r.Stdout+r.Stderr, "buildx") {
		t.Errorf("want no word of a buildx plugin:\n%s", r)
	}
	if out, err := docker("image", "inspect", "--format", "{{index .Config.Labels \"dev.propio-sandbox.e2e\"}}", image); err != nil || strings.TrimSpace(out) != "build" {
		t.Fatalf("the built image is not there: %v %s", err, out)
	}
	// There now: the next run builds nothing.
	if r := s.Run("", "-p", p, "--", "exit", "0"); r.Code != 0 || strings.Contains(strings.ToLower(r.Stderr), "step ") {
		t.Fatalf("want the second run to build nothing:\n%s", r)
	}

	r = s.Run("", "build", "-p", p)
	if r.Code != 0 || !strings.Contains(r.Stdout, "built "+image) || !buildStepShown(r.Stderr) || strings.Contains(r.Stderr, "buildx") {
		t.Fatalf("build, showing its steps:\n%s", r)
	}

	// run --build builds it again, then runs.
	docker("image", "rm", "-f", image)
	if r := s.Run("", "run", "--build", "-p", p, "--", "exit", "5"); r.Code != 5 || !buildStepShown(r.Stderr) {
		t.Fatalf("run --build:\n%s", r)
	}
}

// buildStepShown: the build's second step is in out, as Docker (Step 2/2 :
// LABEL ...) or Podman (STEP 2/2: LABEL ...) says it.
func buildStepShown(out string) bool {
	return strings.Contains(strings.ToLower(out), "step 2/2") && strings.Contains(out, "LABEL dev.propio-sandbox.e2e=build")
}

// TestBuildBaseImageMissing: a build whose base image is not on the engine
// and cannot be pulled (its registry is a .test name) says so, and how to
// get it.
func TestBuildBaseImageMissing(t *testing.T) {
	s := newSandbox(t)
	image := "propio-sandbox-e2e/built:" + randomID()
	base := "registry.propio-sandbox.test/e2e/base:" + randomID()
	t.Cleanup(func() { docker("image", "rm", "-f", image) })
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+base+"\nRUN true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := s.Profile("image: " + image + "\nbuild: {context: " + dir + "}\nnetwork: {mode: none}\n")
	r := s.Run("", "build", "-p", p)
	if r.Code != 1 || !strings.Contains(r.Stderr, "the base image "+base+" is not on the engine, and the engine could not pull it") ||
		!strings.Contains(r.Stderr, "propio-sandbox: hint: where a registry is reachable: docker pull "+base) {
		t.Fatalf("want the missing base image named, with how to get it:\n%s", r)
	}
	if _, err := docker("image", "inspect", image); err == nil {
		t.Errorf("%s exists after a failed build", image)
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
