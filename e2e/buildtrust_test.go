package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildTrustAgentEdits: a trusted repository profile builds its image
// from the workspace (build: {context: ..}). The agent, from inside a
// sandbox of it, edits the Dockerfile, or a file the Dockerfile copies;
// then run --build and build are refused, naming the file, and the image is
// not rebuilt; once the user trusts the new version, it builds.
func TestBuildTrustAgentEdits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, op, changed string
	}{
		{"Dockerfile", "write Dockerfile FROM " + ProbeImage + "\nLABEL dev.propio-sandbox.e2e=agent\nCOPY setup.sh /setup.sh\n", "Dockerfile changed"},
		{"copied script", "append setup.sh echo from the agent\n", "setup.sh changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSandbox(t)
			image := "propio-sandbox-e2e/built:" + randomID()
			t.Cleanup(func() { docker("image", "rm", "-f", image) })
			isolationWriteFile(t, filepath.Join(s.Workspace, ".propio", "sandbox.yaml"), "image: "+image+"\nbuild: {context: ..}\nnetwork: {mode: none}\n")
			isolationWriteFile(t, filepath.Join(s.Workspace, "Dockerfile"), "FROM "+ProbeImage+"\nLABEL dev.propio-sandbox.e2e=trusted\nCOPY setup.sh /setup.sh\n")
			isolationWriteFile(t, filepath.Join(s.Workspace, "setup.sh"), "echo setup\n")
			imageID := func() string {
				t.Helper()
				out, err := docker("image", "inspect", "--format", "{{.Id}} {{index .Config.Labels \"dev.propio-sandbox.e2e\"}}", image)
				if err != nil {
					t.Fatalf("the image is not there: %v", err)
				}
				return strings.TrimSpace(out)
			}

			if r := s.Run("", "trust"); r.Code != 0 || !strings.Contains(r.Stdout, "trusted .propio/sandbox.yaml and its build") {
				t.Fatalf("trust:\n%s", r)
			}
			if r := s.Run("", "build"); r.Code != 0 {
				t.Fatalf("build of the trusted profile:\n%s", r)
			}
			built := imageID()
			if !strings.HasSuffix(built, " trusted") {
				t.Fatalf("built %q, want the label trusted", built)
			}

			// The agent, from inside a sandbox of the trusted profile.
			probeOK(t, s.Run("", "run", "--", "fs", tc.op), "done 1")

			r := s.Run("", "run", "--build", "--", "exit", "0")
			errorsCheck(t, r, 3, []string{"preflight check trust failed", tc.changed}, []string{"propio-sandbox trust"})
			r = s.Run("", "build")
			errorsCheck(t, r, 1, []string{tc.changed}, []string{"propio-sandbox trust"})
			if got := imageID(); got != built {
				t.Fatalf("the image was rebuilt from what the agent wrote: %s, was %s", got, built)
			}
			if left := s.Leftovers(); len(left) > 0 {
				t.Errorf("refused builds left %v", left)
			}

			// Trusted again by the user: it builds.
			if r := s.Run("", "trust"); r.Code != 0 {
				t.Fatalf("trust:\n%s", r)
			}
			if r := s.Run("", "run", "--build", "--", "read", "/setup.sh"); r.Code != 0 || !strings.Contains(r.Stdout, "echo setup") {
				t.Fatalf("run --build after trust:\n%s", r)
			}
			if got := imageID(); got == built {
				t.Errorf("run --build after trust did not rebuild: %s", got)
			}
			if tc.name == "Dockerfile" && !strings.HasSuffix(imageID(), " agent") {
				t.Errorf("the rebuilt image %q lacks the agent's label", imageID())
			}
			if _, err := os.Stat(filepath.Join(s.Home, ".local", "state", "propio-sandbox", "trusted-manifests")); err != nil {
				t.Errorf("no manifests kept with the trust store: %v", err)
			}
		})
	}
}
