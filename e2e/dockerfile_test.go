package e2e

// The top-level Dockerfile, the default sandbox image propio-sandbox/agent,
// builds on the engine and holds the tools the built-in profiles promise.
// Needs a Docker engine and the base image debian:bookworm-slim, which
// `bash e2e/base-image.sh` makes without a registry (CI runs it first).

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const dockerfileBaseImage = "debian:bookworm-slim"

func TestDockerfileBuilds(t *testing.T) {
	dockerfileNeedEngine(t)
	root := dockerfileRepoRoot(t)

	id := dockerfileRandomID(t)
	tag := "propio-sandbox/agent:test-" + id
	label := "dev.propio-sandbox.test=dockerfile-" + id
	t.Cleanup(func() {
		// Containers first (--rm normally removed them; a timed-out run may not
		// have), then the tag. Layers shared with propio-sandbox/agent:latest stay.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := dockerfileDocker(ctx, "ps", "-aq", "--filter", "label="+label)
		if err != nil {
			t.Logf("cleanup: listing test containers: %v\n%s", err, out)
		} else if ids := strings.Fields(out); len(ids) > 0 {
			if out, err := dockerfileDocker(ctx, append([]string{"rm", "-f"}, ids...)...); err != nil {
				t.Logf("cleanup: removing test containers: %v\n%s", err, out)
			}
		}
		if out, err := dockerfileDocker(ctx, "image", "rm", "-f", tag); err != nil {
			t.Errorf("cleanup: removing %s: %v\n%s", tag, err, out)
		}
	})

	// The packages come from Debian's mirror, and tests send nothing off the
	// machine: .ci/run builds propio-sandbox/agent:latest first (setup, like
	// installing the engine), and this build, with no network, must come
	// entirely from that build's cache.
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := dockerfileDocker(ctx, "build", "--network", "none", "--force-rm", "--label", label, "-t", tag,
		"-f", filepath.Join(root, "Dockerfile"), root)
	if err != nil {
		t.Fatalf("docker build of %s/Dockerfile without network (build it once with network first: docker build -t propio-sandbox/agent:latest %s, as .ci/run does): %v\n%s", root, root, err, dockerfileTail(out, 40))
	}
	t.Logf("built %s in %s", tag, time.Since(start).Round(time.Second))

	t.Run("config", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		out, err := dockerfileDocker(ctx, "image", "inspect", "--format", "{{json .Config}}", tag)
		if err != nil {
			t.Fatalf("docker image inspect: %v\n%s", err, out)
		}
		var cfg struct {
			WorkingDir string
			Cmd        []string
			Entrypoint []string
			User       string
			Env        []string
		}
		if err := json.Unmarshal([]byte(out), &cfg); err != nil {
			t.Fatalf("decoding the image config: %v\n%s", err, out)
		}
		if cfg.WorkingDir != "/workspace" {
			t.Errorf("WORKDIR = %q, want /workspace", cfg.WorkingDir)
		}
		if strings.Join(cfg.Cmd, " ") != "bash" || len(cfg.Entrypoint) != 0 {
			t.Errorf("ENTRYPOINT %q CMD %q, want no entrypoint and CMD [bash]", cfg.Entrypoint, cfg.Cmd)
		}
		if cfg.User != "" {
			t.Errorf("USER = %q, want none: the launcher chooses the user", cfg.User)
		}
		for _, kv := range cfg.Env {
			name, _, _ := strings.Cut(kv, "=")
			for _, word := range []string{"KEY", "TOKEN", "SECRET", "PASSWORD"} {
				if strings.Contains(strings.ToUpper(name), word) {
					t.Errorf("the image sets %s: secrets must arrive at run time", name)
				}
			}
		}
	})

	// Each check runs in a fresh container with no network, as root (the
	// image's default user).
	checks := []struct {
		name string
		cmd  string
	}{
		{"git", "git --version"},
		{"ssh", "ssh -V"},
		{"curl", "curl --version"},
		{"bash", "bash --version"},
		{"node", "node --version"},
		{"npm", "npm --version"},
		{"python3", "python3 --version"},
		{"make", "make --version"},
		{"ca-certificates", "test -s /etc/ssl/certs/ca-certificates.crt"},
		{"workdir", `test "$(pwd)" = /workspace`},
		{"app", "test -d /app && test -s /app/README"},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			out, err := dockerfileDocker(ctx, "run", "--rm", "--network", "none", "--label", label,
				tag, "sh", "-c", c.cmd)
			if err != nil {
				t.Fatalf("%s in %s: %v\n%s", c.cmd, tag, err, out)
			}
			t.Logf("%s: %s", c.cmd, dockerfileFirstLine(out))
		})
	}
}

// dockerfileNeedEngine skips the test when there is no engine or no base image,
// or fails it when PROPIO_E2E=require.
func dockerfileNeedEngine(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		dockerfileSkipOrFail(t, "no docker CLI on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if out, err := dockerfileDocker(ctx, "info", "--format", "{{.ServerVersion}}"); err != nil {
		dockerfileSkipOrFail(t, "no Docker engine reachable (docker info: %v): %s", err, strings.TrimSpace(out))
	}
	if out, err := dockerfileDocker(ctx, "image", "inspect", "--format", "{{.Id}}", dockerfileBaseImage); err != nil {
		dockerfileSkipOrFail(t, "the base image %s is missing (%s); run `bash e2e/base-image.sh` to make it without a registry",
			dockerfileBaseImage, strings.TrimSpace(out))
	}
}

func dockerfileSkipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("PROPIO_E2E") == "require" {
		t.Fatalf("PROPIO_E2E=require: "+format, args...)
	}
	t.Skipf(format+" (set PROPIO_E2E=require to fail instead)", args...)
}

// dockerfileDocker runs the docker CLI and returns its combined output.
func dockerfileDocker(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.WaitDelay = 5 * time.Second
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	err := cmd.Run()
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	return buf.String(), err
}

// dockerfileRepoRoot is the repository root: the parent of this package's
// directory, where the Dockerfile is.
func dockerfileRepoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "Dockerfile")); err != nil {
		t.Fatalf("finding the top-level Dockerfile: %v", err)
	}
	return root
}

func dockerfileRandomID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// dockerfileTail is the last n lines of s.
func dockerfileTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func dockerfileFirstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
