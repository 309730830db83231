//go:build unix

package e2e

// bin/propio-sandbox, the launcher script for running from a checkout: it works
// through symlinks from any directory, builds bin/.build/propio-sandbox when
// that is missing or stale (and only then), and runs it in the caller's
// directory. Needs bash and Go, not a container engine.
//
// The subtests share the one built binary, so they run in order, not in
// parallel, and hold a lock against the same test in other processes (several
// `go test ./...` in one checkout). They change only the binary's modification
// time, never a source.

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestBinScript(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skipf("no bash on PATH: %v", err)
	}
	root := binscriptRepoRoot(t)
	script := filepath.Join(root, "bin", "propio-sandbox")
	built := filepath.Join(root, "bin", ".build", "propio-sandbox")
	binscriptLock(t, filepath.Join(root, "bin", ".build", ".binscript-test.lock"))

	// elsewhere/ps -> ../links/propio-sandbox (relative) -> bin/propio-sandbox:
	// the script must follow both links to find the checkout.
	tmp := t.TempDir()
	for _, dir := range []string{"links", "elsewhere", "cwd"} {
		if err := os.Mkdir(filepath.Join(tmp, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(script, filepath.Join(tmp, "links", "propio-sandbox")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(tmp, "elsewhere", "ps")
	if err := os.Symlink(filepath.Join("..", "links", "propio-sandbox"), link); err != nil {
		t.Fatal(err)
	}
	cwd := filepath.Join(tmp, "cwd")

	// The go command reads its settings (GOFLAGS, GOTOOLCHAIN, ...) from a file
	// under the user config dir; keep that file when XDG_CONFIG_HOME changes below.
	goenv := binscriptGoEnv(t)

	t.Run("version through symlinks from another directory", func(t *testing.T) {
		r := binscriptRun(t, cwd, nil, link, "version")
		if r.err != nil {
			t.Fatalf("%s version: %v\nstderr:\n%s", link, r.err, r.stderr)
		}
		if !strings.HasPrefix(r.stdout, "propio-sandbox ") {
			t.Errorf("%s version printed %q, want it to start with %q", link, r.stdout, "propio-sandbox ")
		}
		if _, err := os.Stat(built); err != nil {
			t.Errorf("the binary is not at bin/.build/propio-sandbox: %v", err)
		}
	})

	t.Run("rebuilds when stale and only then", func(t *testing.T) {
		past := binscriptNewestSource(t, root).Add(-time.Hour)
		if err := os.Chtimes(built, past, past); err != nil {
			t.Fatalf("making the binary stale: %v", err)
		}
		r := binscriptRun(t, cwd, nil, link, "version")
		if r.err != nil {
			t.Fatalf("version after making the binary stale: %v\nstderr:\n%s", r.err, r.stderr)
		}
		if !strings.Contains(r.stderr, "building propio-sandbox...") {
			t.Errorf("a stale binary was not rebuilt: stderr %q, want it to say building propio-sandbox...", r.stderr)
		}
		if fi, err := os.Stat(built); err != nil {
			t.Fatal(err)
		} else if !fi.ModTime().After(past) {
			t.Errorf("the binary's mtime is still %v after the rebuild", fi.ModTime())
		}
		if !strings.HasPrefix(r.stdout, "propio-sandbox ") {
			t.Errorf("the rebuilt binary printed %q", r.stdout)
		}

		r = binscriptRun(t, cwd, nil, link, "version")
		if r.err != nil {
			t.Fatalf("version right after the rebuild: %v\nstderr:\n%s", r.err, r.stderr)
		}
		if strings.Contains(r.stderr, "building") {
			t.Errorf("a fresh binary was rebuilt: stderr %q", r.stderr)
		}
		binscriptNoTempFiles(t, filepath.Dir(built))
	})

	t.Run("a stale binary and no go: clear error, binary kept", func(t *testing.T) {
		path, ok := binscriptPathWithoutGo()
		if !ok {
			t.Skip("go shares a PATH directory with bash; cannot hide it")
		}
		fi, err := os.Stat(built)
		if err != nil {
			t.Fatal(err)
		}
		fresh := fi.ModTime()
		past := binscriptNewestSource(t, root).Add(-time.Hour)
		if err := os.Chtimes(built, past, past); err != nil {
			t.Fatal(err)
		}
		// Put back the binary's own, fresh time: its contents are current.
		t.Cleanup(func() {
			if err := os.Chtimes(built, fresh, fresh); err != nil {
				t.Errorf("restoring the binary's mtime: %v", err)
			}
		})
		r := binscriptRun(t, cwd, []string{"PATH=" + path}, link, "version")
		if code := r.exitCode(); code != 1 {
			t.Errorf("exit code %d (%v), want 1\nstderr:\n%s", code, r.err, r.stderr)
		}
		if !strings.Contains(r.stderr, "Go is required") {
			t.Errorf("stderr %q does not say that Go is required", r.stderr)
		}
		if r.stdout != "" {
			t.Errorf("stdout %q, want nothing", r.stdout)
		}
		if fi, err := os.Stat(built); err != nil {
			t.Errorf("the old binary is gone: %v", err)
		} else if !fi.ModTime().Equal(past) {
			t.Errorf("the old binary changed (mtime %v)", fi.ModTime())
		}
		binscriptNoTempFiles(t, filepath.Dir(built))
	})

	t.Run("render uses the caller's directory as the workspace", func(t *testing.T) {
		// Stale, so the run goes through the build too: building must not
		// change the directory the binary then runs in.
		past := binscriptNewestSource(t, root).Add(-time.Hour)
		if err := os.Chtimes(built, past, past); err != nil {
			t.Fatal(err)
		}
		ws := t.TempDir()
		env := []string{
			"XDG_CONFIG_HOME=" + t.TempDir(), // no user profiles
			"XDG_STATE_HOME=" + t.TempDir(),
			"GOENV=" + goenv,
		}
		r := binscriptRun(t, ws, env, link, "render")
		if r.err != nil {
			t.Fatalf("render in %s: %v\nstderr:\n%s", ws, r.err, r.stderr)
		}
		if !strings.Contains(r.stderr, "building propio-sandbox...") {
			t.Errorf("render with a stale binary did not rebuild it: stderr %q", r.stderr)
		}
		real, err := filepath.EvalSymlinks(ws) // macOS: /var is /private/var
		if err != nil {
			t.Fatal(err)
		}
		want := "source: " + real
		found := false
		for _, line := range strings.Split(r.stdout, "\n") {
			if strings.TrimSpace(line) == want {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("render output has no line %q:\n%s", want, r.stdout)
		}
	})
}

type binscriptResult struct {
	stdout, stderr string
	err            error
}

func (r binscriptResult) exitCode() int {
	if r.err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(r.err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// binscriptRun runs the script in dir with extra environment settings. The
// first run may build the binary, so it gets minutes.
func binscriptRun(t *testing.T, dir string, env []string, name string, args ...string) binscriptResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: %v\nstderr:\n%s", name, strings.Join(args, " "), ctx.Err(), stderr.String())
	}
	return binscriptResult{stdout.String(), stderr.String(), err}
}

// binscriptNewestSource is the newest modification time among the files the
// script's staleness check looks at.
func binscriptNewestSource(t *testing.T, root string) time.Time {
	t.Helper()
	var newest time.Time
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == ".git" || rel == filepath.Join("bin", ".build") {
				return filepath.SkipDir
			}
			return nil
		}
		top, _, _ := strings.Cut(filepath.ToSlash(rel), "/")
		if !strings.HasSuffix(path, ".go") && rel != "go.mod" && rel != "go.sum" &&
			top != "profiles" && top != "schema" && top != "templates" {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.ModTime().After(newest) {
			newest = info.ModTime()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("finding the newest source file: %v", err)
	}
	return newest
}

// binscriptPathWithoutGo is $PATH without the directories that hold go, if
// bash is still found on it.
func binscriptPathWithoutGo() (string, bool) {
	var keep []string
	bash := false
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "bash")); err == nil {
			bash = true
		}
		keep = append(keep, dir)
	}
	return strings.Join(keep, string(filepath.ListSeparator)), bash
}

func binscriptGoEnv(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "env", "GOENV").Output()
	if err != nil {
		t.Fatalf("go env GOENV: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// binscriptNoTempFiles checks that no half-written binary is left behind.
func binscriptNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(dir, ".propio-sandbox.*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("temporary build files left in %s: %q", dir, left)
	}
}

// binscriptLock holds an exclusive lock on path until the test ends.
func binscriptLock(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
	done := make(chan error, 1)
	go func() { done <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("locking %s: %v", path, err)
		}
	case <-time.After(10 * time.Minute):
		t.Fatalf("another TestBinScript held %s for 10 minutes", path)
	}
}

// binscriptRepoRoot is the repository root: the parent of this package's directory.
func binscriptRepoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "propio-sandbox")); err != nil {
		t.Fatalf("finding bin/propio-sandbox: %v", err)
	}
	return root
}
