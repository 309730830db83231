// Package testenv prepares what the end-to-end tests and the benchmarks need
// from a real engine: the propio-sandbox binary under test and the probe
// image (FROM scratch plus the static helper in e2e/probe). Nothing is
// pulled: images are built here. It is test support, imported only by tests.
package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/gatewayimage"
)

// ProbeImage is the image the tests run: FROM scratch plus /probe. Its tag
// is the probe's content hash, set when RequireEngine has built it, so that
// test runs of different checkouts on one engine never run each other's
// probe.
var ProbeImage = "propio-sandbox-e2e/probe:latest"

var (
	once     sync.Once
	err      error
	launcher string
	dir      string

	launcherOnce sync.Once
	launcherErr  error

	probeOnce sync.Once
	probeErr  error
	probeBin  string
)

// RepoRoot is the module's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// EngineReason returns why no engine is reachable, or "" when one is.
func EngineReason() string {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput()
	if err != nil {
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return fmt.Sprintf("no container engine reachable (docker info: %v: %s)", err, line)
	}
	return ""
}

// RequireEngine skips tb when no engine is reachable, or fails it when
// PROPIO_E2E=require. Then it builds the launcher and the probe image, once
// per test binary, and returns the launcher's path.
func RequireEngine(tb testing.TB) string {
	tb.Helper()
	if reason := EngineReason(); reason != "" {
		if os.Getenv("PROPIO_E2E") == "require" {
			tb.Fatalf("PROPIO_E2E=require, but %s", reason)
		}
		tb.Skipf("skipping: %s; set PROPIO_E2E=require to fail instead", reason)
	}
	once.Do(func() { err = setup() })
	if err != nil {
		tb.Fatalf("setting up the end-to-end environment: %v", err)
	}
	return launcher
}

// Launcher builds the propio-sandbox binary, once per test binary, and
// returns its path. It needs no engine: tests of what the launcher says when
// there is none use it.
func Launcher(tb testing.TB) string {
	tb.Helper()
	launcherOnce.Do(func() { launcherErr = buildLauncher() })
	if launcherErr != nil {
		tb.Fatalf("building propio-sandbox: %v", launcherErr)
	}
	return launcher
}

// ProbeBinary builds the static probe (e2e/probe, CGO_ENABLED=0 GOOS=linux,
// as the probe image has it), once per test binary, and returns its path,
// for tests that bind-mount it into another image. It needs no engine;
// Cleanup removes it.
func ProbeBinary(tb testing.TB) string {
	tb.Helper()
	probeOnce.Do(func() { probeErr = buildProbe() })
	if probeErr != nil {
		tb.Fatalf("building the probe: %v", probeErr)
	}
	return probeBin
}

// Cleanup removes the built binaries; call it from TestMain after m.Run.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// buildDirMu guards the making of dir, which the launcher's and the probe's
// builds share and may start at once.
var buildDirMu sync.Mutex

// makeBuildDir makes dir when it is not made yet.
func makeBuildDir() error {
	buildDirMu.Lock()
	defer buildDirMu.Unlock()
	if dir == "" {
		d, err := os.MkdirTemp("", "propio-e2e-build-")
		if err != nil {
			return err
		}
		dir = d
	}
	return nil
}

// buildProbe builds the static probe into dir/probe-bin, making dir when
// needed.
func buildProbe() error {
	if err := makeBuildDir(); err != nil {
		return err
	}
	out := filepath.Join(dir, "probe-bin", "probe")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	build := exec.Command("go", "build", "-o", out, "./e2e/probe")
	build.Dir = RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("%v\n%s", err, out)
	}
	probeBin = out
	return nil
}

// buildLauncher builds propio-sandbox into dir, making dir when needed.
func buildLauncher() error {
	if err := makeBuildDir(); err != nil {
		return err
	}
	launcher = filepath.Join(dir, "propio-sandbox")
	// With the tests' hooks (tag e2ehooks: a launch serves its request
	// handlers on a socket a test names), which a release build has not.
	build := exec.Command("go", "build", "-tags", "e2ehooks", "-o", launcher, "./cmd/propio-sandbox")
	build.Dir = RepoRoot()
	// Static, as bin/propio-sandbox builds it: the allowlist gateway's image
	// is made of this binary.
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("%v\n%s", err, out)
	}
	return nil
}

func setup() error {
	launcherOnce.Do(func() { launcherErr = buildLauncher() })
	if launcherErr != nil {
		return fmt.Errorf("building propio-sandbox: %w", launcherErr)
	}
	root := RepoRoot()
	ctxDir := filepath.Join(dir, "probe-image")
	if err := os.MkdirAll(ctxDir, 0o755); err != nil {
		return err
	}
	probe := exec.Command("go", "build", "-o", filepath.Join(ctxDir, "probe"), "./e2e/probe")
	probe.Dir = root
	probe.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := probe.CombinedOutput(); err != nil {
		return fmt.Errorf("building the probe: %v\n%s", err, out)
	}
	dockerfile := "FROM scratch\nCOPY probe /probe\nENTRYPOINT [\"/probe\"]\n"
	if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		return err
	}
	bin, err := os.ReadFile(filepath.Join(ctxDir, "probe"))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(bin)
	tag := "propio-sandbox-e2e/probe:" + hex.EncodeToString(sum[:6])
	if _, err := Docker("build", "-q", "-t", tag, ctxDir); err != nil {
		return fmt.Errorf("building the probe image: %w", err)
	}
	ProbeImage = tag
	return nil
}

// Docker runs the docker CLI for a test's own observations, bounded by five
// minutes (an image build is the longest).
func Docker(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// RemoveNetwork removes a network a test made, once nothing is attached
// to it: a sandbox's gateway joins a test's outside network, and a launcher
// removes it in the background, which may outlast the test's own cleanup
// (which runs first). Bounded: a minute, then the error is the test's (a
// gateway that never leaves is a leak). A network left behind holds one
// of the engine's address pools.
func RemoveNetwork(tb testing.TB, name string) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := Docker("network", "rm", name)
		if err == nil || strings.Contains(strings.ToLower(out+err.Error()), "not found") || strings.Contains(strings.ToLower(out+err.Error()), "no such network") {
			return
		}
		if time.Now().After(deadline) {
			tb.Errorf("removing the test's network %s: %v %s", name, err, out)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// EnginePodman reports whether the tests' engine is Podman.
func EnginePodman(tb testing.TB) bool {
	tb.Helper()
	out, err := Docker("version", "--format", "{{range .Server.Components}}{{.Name}} {{end}}")
	if err != nil {
		tb.Fatalf("docker version: %v", err)
	}
	return strings.Contains(out, "Podman")
}

// GatewayImage is the gateway image the launcher at exe makes of itself
// (gatewayimage.Tag), built into the Docker engine when it lacks it.
func GatewayImage(tb testing.TB, exe string) string {
	tb.Helper()
	tag, err := gatewayimage.Tag(exe)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := Docker("image", "inspect", tag); err == nil {
		return tag
	}
	bctx, err := gatewayimage.Context(exe)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "docker", "build", "-q", "-t", tag, "-")
	build.Stdin = bctx
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("building the gateway image: %v\n%s", err, out)
	}
	return tag
}
