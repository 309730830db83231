package testenv

import (
	"context"
	"os"
	"os/exec"
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
