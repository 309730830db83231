package e2e

// The host's git never runs what a sandbox wrote: each attack is made from
// inside a real sandbox, then the host's real git is run in the workspace
// (status, diff, log, commit, an alias, rebase --continue), and a marker
// file that the planted command would make must not exist.

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// hostGit runs the host's git in dir and returns its output and error.
func hostGit(s *sandbox, dir string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = testenv.GitEnv(s.Home)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// mustGit is hostGit that fails the test on an error.
func mustGit(t *testing.T, s *sandbox, dir string, args ...string) string {
	t.Helper()
	out, err := hostGit(s, dir, args...)
	if err != nil {
		t.Fatalf("git %v in %s: %v\n%s", args, dir, err, out)
	}
	return out
}

// gitRepo makes the workspace a repository with one commit.
func gitRepo(t *testing.T, s *sandbox) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("the host's git is needed: %v", err)
	}
	mustGit(t, s, s.Workspace, "init", "-q", "-b", "main")
	isolationWriteFile(t, filepath.Join(s.Workspace, "README"), "hello\n")
	mustGit(t, s, s.Workspace, "add", "README")
	mustGit(t, s, s.Workspace, "commit", "-q", "-m", "first")
}

// marker is a host path that the planted commands make, and payload the
// command; the workspace's git must never make it.
func marker(t *testing.T) (path, payload string) {
	path = filepath.Join(t.TempDir(), "git-ran-what-the-sandbox-wrote")
	return path, "touch " + path + ";:"
}

// useHostGit runs what a user runs after a sandbox in dir: status, diff,
// log, a commit, an alias and a rebase --continue; then the marker must not
// exist. Failures of the commands themselves do not matter here.
func useHostGit(t *testing.T, s *sandbox, dir, mark string) {
	t.Helper()
	testenv.UseHostGit(t, dir, s.Home, mark)
}

// fakeGitDir are probe operations making a git directory at dir that git
// takes for one, with config as its configuration.
func fakeGitDir(dir, config string) []string {
	return []string{
		"mkdir " + dir + "/objects/info", "mkdir " + dir + "/refs/heads", "mkdir " + dir + "/hooks",
		"write " + dir + "/HEAD ref: refs/heads/main\n",
		"write " + dir + "/config " + config,
	}
}

// probeFS runs probe fs operations in a sandbox of profile p.
func probeFS(s *sandbox, p string, ops ...string) Result {
	s.t.Helper()
	return probeRun(s, p, append([]string{"fs"}, ops...)...)
}

// wantPutAside fails the test unless the launcher reported each path put
// aside (or cleaned) and it is no longer in the workspace as it was.
func wantReported(t *testing.T, r Result, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if !strings.Contains(r.Stderr, p) {
			t.Errorf("the launcher did not report %s:\n%s", p, r)
		}
	}
	if len(paths) > 0 && !strings.Contains(r.Stderr, "what was put aside is kept in") {
		t.Errorf("no hint about the quarantine:\n%s", r)
	}
}

// gitCase makes one attack's world: a sandbox (its workspace a repository
// with one commit when repo is set), a marker and the payload that makes
// it, and a profile without network.
func gitCase(t *testing.T, repo bool) (s *sandbox, mark, payload, p string) {
	t.Helper()
	s = newSandbox(t)
	if repo {
		gitRepo(t, s)
	}
	mark, payload = marker(t)
	return s, mark, payload, s.Profile(probeOffline)
}

// TestGitGuard: the attacks of issue 14 on the workspace's git, and the
// others like them, each from inside a sandbox.
func TestGitGuard(t *testing.T) {
	t.Parallel()
	requireEngine(t)

	t.Run("commondir to a copy of .git", func(t *testing.T) {
		t.Parallel()
		s, mark, payload, p := gitCase(t, true)
		r := probeFS(s, p, "cpr .git copy-of-git", "write copy-of-git/config "+testenv.EvilGitConfig(payload), "write .git/commondir ../copy-of-git")
		probeOK(t, r, "done 3")
		wantReported(t, r, ".git/commondir", "copy-of-git/config")
		if _, err := os.Lstat(filepath.Join(s.Workspace, ".git", "commondir")); err == nil {
			t.Fatal(".git/commondir is still there")
		}
		useHostGit(t, s, s.Workspace, mark)
		useHostGit(t, s, filepath.Join(s.Workspace, "copy-of-git"), mark)
	})

	t.Run(".git renamed or removed or replaced", func(t *testing.T) {
		t.Parallel()
		s, mark, payload, p := gitCase(t, true)
		probeFails(t, probeFS(s, p, "mv .git .git-orig"), "device or resource busy")
		probeFails(t, probeFS(s, p, "write gitfile gitdir: evil", "mv gitfile .git"), "")
		probeFails(t, probeFS(s, p, "symlink /tmp .git-link", "mv .git-link .git"), "")
		probeFails(t, probeFS(s, p, "rmrf .git"), "")
		// The configuration cannot be replaced by a rename either.
		probeFails(t, probeFS(s, p, "write .git/config.new "+testenv.EvilGitConfig(payload), "mv .git/config.new .git/config"), "")
		probeFails(t, probeFS(s, p, "write .git/config "+testenv.EvilGitConfig(payload)), "read-only file system")
		if fi, err := os.Lstat(filepath.Join(s.Workspace, ".git")); err != nil || !fi.IsDir() {
			t.Fatalf(".git is not the directory it was: %v", err)
		}
		useHostGit(t, s, s.Workspace, mark)
	})

	t.Run("hooks when the repository had none", func(t *testing.T) {
		t.Parallel()
		s, mark, payload, p := gitCase(t, true)
		os.RemoveAll(filepath.Join(s.Workspace, ".git", "hooks"))
		probeFails(t, probeFS(s, p, "write .git/hooks/pre-commit #!/bin/sh\n"+payload+"\n", "chmod 755 .git/hooks/pre-commit"), "read-only file system")
		names, err := os.ReadDir(filepath.Join(s.Workspace, ".git", "hooks"))
		if err != nil || len(names) != 0 {
			t.Fatalf(".git/hooks should be there, empty: %v %v", names, err)
		}
		useHostGit(t, s, s.Workspace, mark)
	})

	t.Run("config.worktree includes and husky", func(t *testing.T) {
		t.Parallel()
		s, mark, payload, p := gitCase(t, true)
		mustGit(t, s, s.Workspace, "config", "extensions.worktreeConfig", "true")
		mustGit(t, s, s.Workspace, "config", "--add", "include.path", "../team.gitconfig")
		mustGit(t, s, s.Workspace, "config", "--add", "include.path", "../local.gitconfig")
		mustGit(t, s, s.Workspace, "config", "core.hooksPath", ".husky/_")
		isolationWriteFile(t, filepath.Join(s.Workspace, "team.gitconfig"), "[user]\n\tname = team\n")
		isolationWriteFile(t, filepath.Join(s.Workspace, ".husky", "_", "h"), "#!/bin/sh\n")
		isolationWriteFile(t, filepath.Join(s.Workspace, ".husky", "pre-commit"), "true\n")
		// pre-commit's hook runs what .pre-commit-config.yaml says.
		isolationWriteFile(t, filepath.Join(s.Workspace, ".git", "hooks", "pre-push"), "#!/usr/bin/env python3\n# File generated by pre-commit: https://pre-commit.com\n")
		isolationWriteFile(t, filepath.Join(s.Workspace, ".pre-commit-config.yaml"), "repos: []\n")
		for _, path := range []string{"team.gitconfig", ".husky/pre-commit", ".husky/_/pre-commit", ".husky/_/h", ".pre-commit-config.yaml"} {
			probeFails(t, probeFS(s, p, "write "+path+" [core]\n\tfsmonitor = "+payload+"\n"), "read-only file system")
		}
		r := probeFS(s, p, "write .git/config.worktree [core]\n\tfsmonitor = "+payload+"\n", "write local.gitconfig [core]\n\tfsmonitor = "+payload+"\n")
		probeOK(t, r, "done 2")
		wantReported(t, r, ".git/config.worktree", "local.gitconfig")
		useHostGit(t, s, s.Workspace, mark)
	})

	t.Run("a repository of the sandbox's own", func(t *testing.T) {
		t.Parallel()
		s, mark, payload, p := gitCase(t, true)
		ops := append(fakeGitDir("sub/.git", testenv.EvilGitConfig(payload)), "write sub/.git/hooks/pre-commit #!/bin/sh\n"+payload+"\n", "chmod 755 sub/.git/hooks/pre-commit")
		// A directory made to look like a bare repository, and a .git file
		// leading out of the workspace.
		ops = append(ops, fakeGitDir("pkg", testenv.EvilGitConfig(payload))...)
		ops = append(ops, "mkdir other", "write other/.git gitdir: /etc")
		r := probeFS(s, p, ops...)
		probeOK(t, r, "done")
		wantReported(t, r, "sub/.git/config", "sub/.git/hooks/pre-commit", "pkg/config", "other/.git")
		for _, dir := range []string{"sub", "pkg", "other"} {
			useHostGit(t, s, filepath.Join(s.Workspace, dir), mark)
		}
	})

	t.Run("a workspace that was no repository", func(t *testing.T) {
		t.Parallel()
		s, mark, payload, p := gitCase(t, false)
		r := probeFS(s, p, append(fakeGitDir(".git", testenv.EvilGitConfig(payload)), "write .git/hooks/post-checkout #!/bin/sh\n"+payload+"\n")...)
		probeOK(t, r, "done")
		wantReported(t, r, ".git/config", ".git/hooks/post-checkout")
		useHostGit(t, s, s.Workspace, mark)
	})

	t.Run("a rebase left to continue", func(t *testing.T) {
		t.Parallel()
		s, mark, payload, p := gitCase(t, true)
		head := strings.TrimSpace(mustGit(t, s, s.Workspace, "rev-parse", "HEAD"))
		r := probeFS(s, p, "mkdir .git/rebase-merge",
			"write .git/rebase-merge/git-rebase-todo exec "+payload+"\n",
			"write .git/rebase-merge/head-name refs/heads/main\n", "write .git/rebase-merge/onto "+head+"\n",
			"write .git/rebase-merge/orig-head "+head+"\n", "write .git/rebase-merge/interactive ")
		probeOK(t, r, "done")
		wantReported(t, r, ".git/rebase-merge")
		useHostGit(t, s, s.Workspace, mark)
	})

	t.Run("linked worktrees and submodules", func(t *testing.T) {
		t.Parallel()
		s, mark, payload, p := gitCase(t, true)
		wt := filepath.Join(filepath.Dir(s.Workspace), "linked")
		mustGit(t, s, s.Workspace, "worktree", "add", "-q", wt)
		lib := filepath.Join(filepath.Dir(s.Workspace), "lib")
		os.MkdirAll(lib, 0o755)
		mustGit(t, s, lib, "init", "-q", "-b", "main")
		mustGit(t, s, lib, "commit", "-q", "--allow-empty", "-m", "lib")
		mustGit(t, s, s.Workspace, "-c", "protocol.file.allow=always", "submodule", "add", "-q", lib, "lib")
		id := filepath.Base(wt)
		for _, op := range []string{
			"write .git/worktrees/" + id + "/commondir ../../../copy",
			"write .git/worktrees/" + id + "/config.worktree [core]\n\tfsmonitor = " + payload + "\n",
			"write .git/modules/lib/config " + testenv.EvilGitConfig(payload),
			"write .git/modules/lib/hooks/pre-commit #!/bin/sh\n" + payload + "\n",
		} {
			probeFails(t, probeFS(s, p, op), "")
		}
		// The submodule's .git file is the worktree's: it can be changed,
		// and is judged when the sandbox ends.
		r := probeFS(s, p, "write lib/.git gitdir: /etc\n")
		probeOK(t, r, "done 1")
		wantReported(t, r, "lib/.git")
		useHostGit(t, s, s.Workspace, mark)
		useHostGit(t, s, wt, mark)
		useHostGit(t, s, filepath.Join(s.Workspace, "lib"), mark)
	})

	t.Run("setuid file", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile(probeOffline)
		r := probeFS(s, p, "write tool #!/bin/sh\n", "chmod 6755 tool")
		probeOK(t, r, "done 2")
		wantReported(t, r, "tool")
		fi, err := os.Stat(filepath.Join(s.Workspace, "tool"))
		if err != nil || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
			t.Fatalf("tool: %v %v", fi.Mode(), err)
		}
	})
}

// TestGitGuardCommit: committing from inside the sandbox keeps working,
// with the git directory held and its surface read-only, and the guard has
// nothing to say about it.
func TestGitGuardCommit(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	if _, err := docker("image", "inspect", agentImage); err != nil {
		t.Fatalf("the agent image is needed (.ci/run builds it): %v", err)
	}
	gitRepo(t, s)
	p := s.Profile("image: " + agentImage + "\nnetwork: {mode: none}\n")
	script := `set -e
git config --global user.email agent@x.test
git config --global user.name agent
echo change >> README
git commit -qam "from the sandbox"
git checkout -qb feature
echo more > more.txt
git add more.txt
git commit -qm "a branch"
git checkout -q main
git merge -q --ff-only feature
git log --oneline | wc -l`
	r := s.Run("", "run", "-p", p, "--", "bash", "-c", script)
	if r.Code != 0 || strings.TrimSpace(r.Stdout) != "3" {
		t.Fatalf("committing inside:\n%s", r)
	}
	if strings.Contains(r.Stderr, "put aside") || strings.Contains(r.Stderr, "warning") {
		t.Fatalf("the guard judged ordinary commits:\n%s", r)
	}
	log := mustGit(t, s, s.Workspace, "log", "--format=%s", "main")
	if log != "a branch\nfrom the sandbox\nfirst\n" {
		t.Fatalf("the host's git sees:\n%s", log)
	}
	mustGit(t, s, s.Workspace, "fsck", "--no-progress")
	if out := mustGit(t, s, s.Workspace, "status", "--porcelain"); out != "" {
		t.Fatalf("the workspace is not clean after the sandbox's commits:\n%s", out)
	}
}

// TestGitGuardKilled: when the launcher (and its watchdog) is killed, the
// sandbox goes on until gc removes it; gc then judges what it left.
func TestGitGuardKilled(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	gitRepo(t, s)
	mark, payload := marker(t)
	p := s.Profile(probeOffline)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := s.Command(ctx, "run", "-p", p, "--", "fs", "write .git/commondir ../evil", "mkdir evil/objects", "mkdir evil/refs",
		"write evil/HEAD ref: refs/heads/main\n", "write evil/config "+testenv.EvilGitConfig(payload), "sleep 1h")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	var seen string
	for !strings.Contains(seen, "sleeping") {
		n, err := out.Read(buf)
		if err != nil {
			t.Fatalf("the sandbox did not start: %v (%q)", err, seen)
		}
		seen += string(buf[:n])
	}
	killWatchdog(t, cmd.Process.Pid) // what gc judges: the whole launch killed
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Wait()
	if _, err := os.Lstat(filepath.Join(s.Workspace, ".git", "commondir")); err != nil {
		t.Fatalf("the sandbox did not get to write: %v", err)
	}
	r := s.Run("", "gc")
	if r.Code != 0 {
		t.Fatalf("gc:\n%s", r)
	}
	wantReported(t, r, ".git/commondir", "evil/config")
	useHostGit(t, s, s.Workspace, mark)
}

// TestGitGuardChangesetApply: what an apply writes is judged too.
func TestGitGuardChangesetApply(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	gitRepo(t, s)
	mark, payload := marker(t)
	p := s.Profile(probeOffline)
	r := s.Run("", append([]string{"run", "--changeset", "-p", p, "--", "fs"}, append(fakeGitDir("nested/.git", testenv.EvilGitConfig(payload)), "write nested/.git/hooks/pre-commit #!/bin/sh\n"+payload+"\n")...)...)
	probeOK(t, r, "done")
	r = s.Run("", "apply")
	if r.Code != 0 {
		t.Fatalf("apply:\n%s", r)
	}
	wantReported(t, r, "nested/.git/config", "nested/.git/hooks/pre-commit")
	useHostGit(t, s, filepath.Join(s.Workspace, "nested"), mark)
}

// TestLinksGitAcrossRuns: a .git the sandbox turns into a link to a host
// directory is put aside when it ends; and where such a link is there when
// a sandbox starts (a killed launcher's, or the user's), nothing is mounted
// through it, whatever path rules the profile has.
func TestLinksGitAcrossRuns(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	outside := t.TempDir()
	isolationWriteFile(t, filepath.Join(outside, "config"), "[core]\n\tsshCommand = secret-from-outside\n")
	isolationWriteFile(t, filepath.Join(outside, "hooks", "pre-commit"), "secret-hook-from-outside\n")
	p := s.Profile(probeOffline + "workspace:\n  readonly: [\".git/config\", \".git/hooks\"]\n")

	// Run 1: the sandbox plants the link.
	r := probeFS(s, p, "symlink "+outside+" .git")
	probeOK(t, r, "done 1")
	wantReported(t, r, ".git")
	if _, err := os.Lstat(filepath.Join(s.Workspace, ".git")); err == nil {
		t.Fatal("the planted .git link is still in the workspace")
	}

	// Run 2: the link is there when the sandbox starts.
	if err := os.Symlink(outside, filepath.Join(s.Workspace, ".git")); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"read", ".git/config"}, {"ls", ".git/hooks"}, {"read", "/workspace/.git/hooks/pre-commit"}} {
		r := probeRun(s, p, args...)
		if strings.Contains(r.Stdout+r.Stderr, "secret") {
			t.Fatalf("a host file was mounted through the link:\n%s", r)
		}
		probeFails(t, r, "no such file or directory")
		if !strings.Contains(r.Stderr, ".git is a symbolic link") {
			t.Errorf("the launcher did not warn about the link:\n%s", r)
		}
	}
	isolationHasContent(t, filepath.Join(outside, "config"), "[core]\n\tsshCommand = secret-from-outside\n")
}
