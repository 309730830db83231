package guard

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// repo makes a git repository with one commit at dir, with the host's git.
func repo(t *testing.T, dir string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "init", "-q", "-b", "main", dir)
	write(t, filepath.Join(dir, "README"), "hello\n")
	git(t, dir, "add", "README")
	git(t, dir, "commit", "-q", "-m", "first")
}

// git runs the host's git in dir with a configuration of the test's own
// (no user or system configuration).
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x.test", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x.test")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestScan(t *testing.T) {
	t.Parallel()
	t.Run("repository", func(t *testing.T) {
		t.Parallel()
		ws := t.TempDir()
		repo(t, ws)
		os.RemoveAll(filepath.Join(ws, ".git", "hooks"))
		write(t, filepath.Join(ws, "shared.gitconfig"), "[core]\n")
		write(t, filepath.Join(ws, ".husky", "_", "h"), "")
		git(t, ws, "config", "include.path", "../shared.gitconfig")
		git(t, ws, "config", "includeIf.gitdir:/x/.path", "../missing.gitconfig")
		git(t, ws, "config", "core.hooksPath", ".husky/_")
		plan := Scan([]Root{{Name: "workspace", Source: ws, Target: "/workspace"}})
		rp := plan.Roots[0]
		if rp.GitDir != ".git" {
			t.Fatalf("git dir %q", rp.GitDir)
		}
		wantRO := []string{".git/config", ".git/hooks", ".husky", ".husky/_", "shared.gitconfig"}
		if !slices.Equal(rp.ReadOnly, wantRO) {
			t.Errorf("read-only %q, want %q", rp.ReadOnly, wantRO)
		}
		wantAbsent := []string{".git/commondir", ".git/config.worktree", "missing.gitconfig"}
		if !slices.Equal(rp.Absent, wantAbsent) {
			t.Errorf("absent %q, want %q", rp.Absent, wantAbsent)
		}
		if !slices.Equal(rp.MakeDirs, []string{".git/hooks"}) {
			t.Errorf("make %q", rp.MakeDirs)
		}
		paths := plan.Paths()
		if len(paths) != 6 || paths[0] != (Path{Root: "workspace", Path: ".git"}) || !paths[1].ReadOnly {
			t.Fatalf("paths %+v", paths)
		}
		// Scan changes nothing; Prepare makes the hooks directory.
		if _, err := os.Lstat(filepath.Join(ws, ".git", "hooks")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatal("Scan made the hooks directory")
		}
		if err := plan.Prepare(t.TempDir(), "p1", time.Now()); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(filepath.Join(ws, ".git", "hooks")); err != nil || !fi.IsDir() {
			t.Fatalf("Prepare did not make the hooks directory: %v", err)
		}
	})
	t.Run("symbolic link", func(t *testing.T) {
		t.Parallel()
		ws, outside := t.TempDir(), t.TempDir()
		write(t, filepath.Join(outside, "config"), "[core]\n")
		os.Mkdir(filepath.Join(outside, "hooks"), 0o755)
		if err := os.Symlink(outside, filepath.Join(ws, ".git")); err != nil {
			t.Fatal(err)
		}
		plan := Scan([]Root{{Name: "workspace", Source: ws, Target: "/workspace"}})
		if m := plan.Paths(); len(m) != 0 {
			t.Fatalf("mounts through a link: %+v", m)
		}
		if n := plan.Notes(); len(n) != 1 || !strings.Contains(n[0], ".git is a symbolic link") {
			t.Fatalf("notes %q", n)
		}
	})
	t.Run("gitfile and submodule", func(t *testing.T) {
		t.Parallel()
		ws := t.TempDir()
		repo(t, filepath.Join(ws, "main"))
		sub := filepath.Join(ws, "main", ".git", "modules", "lib")
		repo(t, sub+"-tmp")
		if err := os.Rename(filepath.Join(sub+"-tmp", ".git"), sub); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(ws, "wt", ".git"), "gitdir: ../main/.git\n")
		plan := Scan([]Root{{Name: "workspace", Source: filepath.Join(ws, "wt"), Target: "/w"}, {Name: "mount-0", Source: filepath.Join(ws, "main"), Target: "/m"}})
		if rp := plan.Roots[0]; rp.GitFile != ".git" || rp.GitDir != "" {
			t.Fatalf("a gitfile leading out of its root: %+v", rp)
		}
		rp := plan.Roots[1]
		if !slices.Equal(rp.Protected, []string{".git", ".git/modules/lib"}) {
			t.Fatalf("protected %q", rp.Protected)
		}
		if !slices.Contains(rp.ReadOnly, ".git/modules/lib/config") {
			t.Fatalf("the submodule's configuration is not read-only: %q", rp.ReadOnly)
		}
	})
}

// TestCheckHostGit makes, on the host, what a hostile sandbox would leave,
// checks, then runs the host's real git: nothing the "sandbox" wrote runs.
func TestCheckHostGit(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	repo(t, ws)
	marker := filepath.Join(t.TempDir(), "ran")
	payload := "touch " + marker
	plan := Scan([]Root{{Name: "workspace", Source: ws, Target: "/workspace"}})
	state := t.TempDir()
	if err := plan.Prepare(filepath.Join(state, "guard"), "p2", time.Now()); err != nil {
		t.Fatal(err)
	}
	// What the sandbox can still write: a commondir to a copy of .git with
	// its own configuration, a nested repository, a setuid file.
	evil := filepath.Join(ws, "evil")
	git(t, ws, "init", "-q", evil)
	write(t, filepath.Join(evil, ".git", "config"), "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = "+payload+"\n[alias]\n\tst = !"+payload+"\n")
	write(t, filepath.Join(evil, ".git", "hooks", "pre-commit"), "#!/bin/sh\n"+payload+"\n")
	write(t, filepath.Join(ws, ".git", "commondir"), "../evil/.git\n")
	write(t, filepath.Join(ws, "tool"), "#!/bin/sh\n")
	os.Chmod(filepath.Join(ws, "tool"), 0o755|fs.ModeSetuid)
	write(t, filepath.Join(ws, "sub", ".git"), "gitdir: /somewhere/else\n")
	write(t, filepath.Join(ws, ".git", "rebase-merge", "git-rebase-todo"), "pick 1234 x\nexec "+payload+"\n")

	rep := plan.Check(filepath.Join(state, "quarantine"))
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range rep.Items {
		got = append(got, it.Path+": "+it.Action)
	}
	slices.Sort(got)
	want := []string{
		".git/commondir: " + PutAside,
		".git/rebase-merge: " + PutAside,
		"evil/.git/config: " + Cleaned,
		"evil/.git/hooks/pre-commit: " + PutAside,
		"sub/.git: " + PutAside,
		"tool: " + SetIDRemoved,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if fi, _ := os.Stat(filepath.Join(ws, "tool")); fi.Mode()&fs.ModeSetuid != 0 {
		t.Fatal("tool is still setuid")
	}
	if _, err := os.Stat(filepath.Join(state, "quarantine", "p2", "workspace", ".git", "commondir")); err != nil {
		t.Fatalf("commondir is not in the quarantine: %v", err)
	}
	// The host's git, in the workspace and in the nested repository.
	git(t, ws, "status")
	git(t, evil, "status")
	git(t, evil, "commit", "-q", "--allow-empty", "-m", "x")
	if out, err := exec.Command("git", "-C", evil, "st").CombinedOutput(); err == nil {
		t.Fatalf("the sandbox's alias still works: %s", out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("git ran what the sandbox wrote")
	}
	// A second check finds nothing more.
	if rep := plan.Check(filepath.Join(state, "quarantine")); len(rep.Items) != 0 || rep.Err() != nil {
		t.Fatalf("second check: %+v", rep)
	}
}

// TestCheckKeepsWork: what git inside a sandbox does normally (commits, a
// new repository made with git init, a worktree) is kept as it is.
func TestCheckKeepsWork(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	repo(t, ws)
	plan := Scan([]Root{{Name: "workspace", Source: ws, Target: "/workspace"}})
	if err := plan.Prepare(t.TempDir(), "p3", time.Now()); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(ws, "b.txt"), "b\n")
	git(t, ws, "add", "b.txt")
	git(t, ws, "commit", "-q", "-m", "second")
	git(t, ws, "worktree", "add", "-q", "wt")
	git(t, ws, "init", "-q", "new")
	write(t, filepath.Join(ws, "new", "x"), "x\n")
	git(t, filepath.Join(ws, "new"), "add", "x")
	git(t, filepath.Join(ws, "new"), "commit", "-q", "-m", "x")
	git(t, filepath.Join(ws, "new"), "remote", "add", "origin", "https://x.test/r.git")
	rep := plan.Check(t.TempDir())
	if len(rep.Items) != 0 || rep.Err() != nil {
		t.Fatalf("normal work was judged: %+v", rep)
	}
	git(t, filepath.Join(ws, "wt"), "status")
	if out := git(t, filepath.Join(ws, "new"), "remote", "get-url", "origin"); strings.TrimSpace(out) != "https://x.test/r.git" {
		t.Fatalf("remote: %q", out)
	}
}
