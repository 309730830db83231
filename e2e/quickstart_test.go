//go:build unix

package e2e

// The README's quick start and quick tour, run as written: their commands
// are read from the README itself, so the two cannot drift apart.

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestQuickStart runs the commands of the README's quick start, all but the
// clone, then those of its quick tour, with bash (stopping at the first that
// fails), in a home of their own: ~/propio-sandbox stands for the
// clone (bin/propio-sandbox, the Dockerfile, and the binary under test as
// bin/.build/propio-sandbox, which the script runs as it is: no source is
// newer), ~/bin is on PATH as the README asks, and ~/my-project has a
// Makefile with a test target. The default image is the one CI builds
// before the tests (so the first run builds nothing here; TestBuild covers
// the first run that builds).
func TestQuickStart(t *testing.T) {
	s := newSandbox(t)
	requireAgentImage(t)
	commands := append(readmeBlock(t, "## Quick start"), readmeBlock(t, "## A quick tour")...)

	checkout := filepath.Join(s.Home, "propio-sandbox")
	if err := os.MkdirAll(filepath.Join(checkout, "bin", ".build"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"bin/propio-sandbox", "Dockerfile", ".dockerignore"} {
		b, err := os.ReadFile(filepath.Join(repoRoot(), f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(checkout, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(launcher, filepath.Join(checkout, "bin", ".build", "propio-sandbox")); err != nil {
		t.Fatal(err)
	}
	// ~/my-project is the test's workspace, whose leftovers newSandbox checks.
	if err := os.Symlink(s.Workspace, filepath.Join(s.Home, "my-project")); err != nil {
		t.Fatal(err)
	}
	marker := "make test ran in " + randomID()
	if err := os.WriteFile(filepath.Join(s.Workspace, "Makefile"), []byte("test:\n\t@echo "+marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-x", "-c", strings.Join(commands, "\n"))
	cmd.Dir = s.Home
	cmd.Env = nil
	for _, kv := range s.Env {
		switch {
		case strings.HasPrefix(kv, "PROPIO_HOME="):
			// bin/propio-sandbox sets it, to the checkout.
		case strings.HasPrefix(kv, "PATH="):
			cmd.Env = append(cmd.Env, "PATH="+filepath.Join(s.Home, "bin")+":"+strings.TrimPrefix(kv, "PATH="))
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	r := runCmd(t, ctx, cmd)
	if _, err := os.Stat(filepath.Join(s.Workspace, "profile.schema.json")); err != nil {
		t.Errorf("the tour's last command wrote no schema: %v", err)
	}
	if r.Code != 0 || strings.Contains(r.Stderr, "propio-sandbox: error:") {
		t.Fatalf("the quick start failed:\n%s", r)
	}
	for _, want := range []string{"'Makefile'", marker} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("want %q in the output:\n%s", want, r)
		}
	}
	t.Logf("ran:\n%s", strings.Join(commands, "\n"))
}

// readmeBlock returns the commands of the first sh block of the README's
// section heading: its lines, less blank lines, comment lines and a clone.
func readmeBlock(t *testing.T, heading string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var commands []string
	section, block := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == heading
		case section && !block && line == "```sh":
			block = true
		case block && line == "```":
			if len(commands) == 0 {
				t.Fatalf("the README's %q has no commands", heading)
			}
			return commands
		case block:
			cmd := strings.TrimSpace(line)
			if cmd != "" && !strings.HasPrefix(cmd, "#") && !strings.HasPrefix(cmd, "git clone ") {
				commands = append(commands, cmd)
			}
		}
	}
	t.Fatalf("no sh block under %q in README.md (%v)", heading, sc.Err())
	return nil
}
