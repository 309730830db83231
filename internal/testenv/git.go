package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// GitEnv is the host git's environment in the tests that run it after a
// sandbox: no user or system configuration of the machine (home is the
// test's), an identity, no prompts.
func GitEnv(home string) []string {
	return append(os.Environ(), "HOME="+home, "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=e2e", "GIT_AUTHOR_EMAIL=e2e@x.test", "GIT_COMMITTER_NAME=e2e", "GIT_COMMITTER_EMAIL=e2e@x.test",
		"GIT_TERMINAL_PROMPT=0", "GIT_EDITOR=true")
}

// EvilGitConfig is a git configuration that runs payload (a shell command)
// in every way it can: the fsmonitor, a hooks path of the sandbox's, an
// alias (st), the remote's upload pack.
func EvilGitConfig(payload string) string {
	return "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = " + payload +
		"\n\thooksPath = hooks-of-the-sandbox\n[alias]\n\tst = !" + payload + "\n[remote \"origin\"]\n\turl = /nonexistent\n\tuploadpack = " + payload + "\n"
}

// UseHostGit runs, in dir, what a user runs after a sandbox: status, diff,
// log, a commit, an alias (st), a rebase --continue and a fetch, each with
// GitEnv(home) and bounded; then the file mark (which the commands a
// sandbox plants make) must not exist. Failures of the commands themselves
// do not matter.
func UseHostGit(tb testing.TB, dir, home, mark string) {
	tb.Helper()
	for _, args := range [][]string{
		{"status"}, {"diff", "HEAD"}, {"log", "-1"}, {"commit", "-q", "--allow-empty", "-m", "after the sandbox"},
		{"st"}, {"rebase", "--continue"}, {"fetch", "-q", "origin"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir, cmd.Env = dir, GitEnv(home)
		cmd.Run()
		cancel()
	}
	if _, err := os.Stat(mark); err == nil {
		tb.Fatalf("the host's git ran a command the sandbox wrote (%s exists)", mark)
	}
}

// DivergedRepo makes the repository at dir (its branch main checked out)
// diverge: a branch side of two commits, A (which changes f as main then
// does) and B (a new file), and a commit on main. A rebase or cherry-pick
// of side onto main stops at A, and what follows B runs the merge
// strategy. git runs with GitEnv(home).
func DivergedRepo(tb testing.TB, dir, home string) {
	tb.Helper()
	for _, step := range [][]string{
		{"write", "f", "base\n"}, {"add", "f"}, {"commit", "-qm", "base"},
		{"checkout", "-qb", "side"}, {"write", "f", "a\n"}, {"commit", "-qam", "A"},
		{"write", "g", "b\n"}, {"add", "g"}, {"commit", "-qm", "B"},
		{"checkout", "-q", "main"}, {"write", "f", "m\n"}, {"commit", "-qam", "m"},
	} {
		if step[0] == "write" {
			if err := os.WriteFile(filepath.Join(dir, step[1]), []byte(step[2]), 0o644); err != nil {
				tb.Fatal(err)
			}
			continue
		}
		cmd := exec.Command("git", step...)
		cmd.Dir, cmd.Env = dir, GitEnv(home)
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("git %v in %s: %v\n%s", step, dir, err, out)
		}
	}
}
