package kube

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestKubeLaunchGitGuard: the git guard of a changeset brought back from a
// cluster is Docker's (TestGitGuardChangesetApply, and TestGitGuard's
// read-only surface). The workspace is a repository; from inside the
// sandbox (run --engine kubernetes --changeset), writes to .git/config and
// .git/hooks are refused, and a nested repository is made whose
// configuration and pre-commit hook run a payload on the host. The
// changeset does not hold the workspace's git files; apply puts the
// nested repository's configuration and hook aside and says so; the
// workspace's .git/config is as it was, it has no new hook, and the host's
// git, run in both repositories, runs nothing the sandbox wrote.
func TestKubeLaunchGitGuard(t *testing.T) {
	c, kubeconfig := testenv.Kube(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("the host's git is needed: %v", err)
	}
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ws := kubeWorkspace(t, "kubegit")
	home := t.TempDir()
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = dir, testenv.GitEnv(home)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git(ws, "init", "-q", "-b", "main")
	git(ws, "add", "hello.txt")
	git(ws, "commit", "-q", "-m", "first")
	configBefore, err := os.ReadFile(filepath.Join(ws, ".git", "config"))
	if err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(t.TempDir(), "git-ran-what-the-sandbox-wrote")
	payload := "touch " + mark + ";:"

	script := `printf '[alias]\n\tst = !` + payload + `\n' >> .git/config 2>/dev/null && echo config-written || echo config-held
printf '#!/bin/sh\n` + payload + `\n' > .git/hooks/pre-commit 2>/dev/null && echo hook-written || echo hook-held
mkdir -p nested/.git/objects/info nested/.git/refs/heads nested/.git/hooks
echo 'ref: refs/heads/main' > nested/.git/HEAD
cat > nested/.git/config <<'CONFIG'
` + testenv.EvilGitConfig(payload) + `CONFIG
printf '#!/bin/sh\n` + payload + `\n' > nested/.git/hooks/pre-commit
chmod 755 nested/.git/hooks/pre-commit
echo changed > hello.txt
echo planted`
	prof := smallProfile(t, "offline", "")
	cmd := launcherIn(t, kubeconfig, ws, home, "run", "--engine", "kubernetes", "--changeset", "-n", ns, "-p", prof, "--", "bash", "-c", script)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := runBounded(t, cmd, 3*time.Minute); err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{"config-held\n", "hook-held\n", "planted\n"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the sandbox's output %q lacks %q", stdout.String(), want)
		}
	}
	waitSelectedGone(t, c, ns, managed, 30*time.Second)

	diff := launcherIn(t, kubeconfig, ws, home, "diff", "--stat")
	out, err := diff.CombinedOutput()
	if err != nil {
		t.Fatalf("diff: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "nested/.git/config") || strings.Contains(string(out), " .git/") {
		t.Errorf("diff --stat: %s, want the nested repository's files and none of the workspace's .git", out)
	}
	apply := launcherIn(t, kubeconfig, ws, home, "apply")
	out, err = apply.CombinedOutput()
	if err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	t.Logf("apply said:\n%s", out)
	for _, want := range []string{"nested/.git/config", "nested/.git/hooks/pre-commit", "what was put aside is kept in"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("apply did not report %q", want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "hello.txt")); string(b) != "changed\n" {
		t.Errorf("after apply hello.txt is %q, want the sandbox's change", b)
	}
	if b, err := os.ReadFile(filepath.Join(ws, ".git", "config")); err != nil || !bytes.Equal(b, configBefore) {
		t.Errorf("the workspace's .git/config changed: %q (%v)", b, err)
	}
	if _, err := os.Lstat(filepath.Join(ws, ".git", "hooks", "pre-commit")); err == nil {
		t.Error("the workspace's repository has the sandbox's pre-commit hook")
	}
	testenv.UseHostGit(t, filepath.Join(ws, "nested"), home, mark)
	testenv.UseHostGit(t, ws, home, mark)
}
