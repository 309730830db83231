package e2e

// Issue 28's attacks on the host's git: an operation left in progress
// whose state names a program (a merge strategy), scripts the user's own
// hooks run, and a persistent sandbox's commondir between two execs. Each
// is made from inside a real sandbox, then the host's real git is run.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// strategyAttack is the script that plants the strategy x/../evil, which
// git runs as ./git-merge-x/../evil: ./evil, which runs payload.
func strategyAttack(payload string) string {
	return `mkdir -p git-merge-x
printf '#!/bin/sh\n%s\n' '` + payload + `' > evil
chmod 755 evil
`
}

// TestGitGuardOperations: a rebase or a cherry-pick left in progress by
// the sandbox's real git, whose strategy it set to a program of its own,
// is put aside when the run ends; the host's rebase --continue and
// cherry-pick --continue run nothing.
func TestGitGuardOperations(t *testing.T) {
	t.Parallel()
	requireEngine(t)
	if _, err := docker("image", "inspect", agentImage); err != nil {
		t.Fatalf("the agent image is needed (.ci/run builds it): %v", err)
	}
	const identity = "export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@x.test GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@x.test GIT_EDITOR=true\n"
	for _, tc := range []struct {
		name, script string
		state        string   // what must be put aside
		resume       []string // the user's git on the host
	}{
		{
			name: "rebase-merge strategy",
			script: `git checkout -q side
GIT_SEQUENCE_EDITOR='sed -i 1s/^pick/edit/' git rebase -i main || true
echo resolved > f && git add f
printf 'x/../evil' > .git/rebase-merge/strategy
`,
			state:  ".git/rebase-merge",
			resume: []string{"rebase", "--continue"},
		},
		{
			name: "sequencer options.strategy",
			script: `git cherry-pick side~1 side || true
echo resolved > f && git add f
printf '[options]\n\tstrategy = x/../evil\n' >> .git/sequencer/opts
`,
			state:  ".git/sequencer",
			resume: []string{"cherry-pick", "--continue"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSandbox(t)
			gitRepo(t, s)
			testenv.DivergedRepo(t, s.Workspace, s.Home)
			mark, payload := marker(t)
			p := s.Profile("image: " + agentImage + "\nnetwork: {mode: none}\n")
			r := s.Run("", "run", "-p", p, "--", "bash", "-c", "set -e\n"+identity+tc.script+strategyAttack(payload)+"ls "+tc.state+" >/dev/null && echo planted")
			if r.Code != 0 || !strings.Contains(r.Stdout, "planted") {
				t.Fatalf("the attack did not run:\n%s", r)
			}
			wantReported(t, r, tc.state)
			if _, err := os.Lstat(filepath.Join(s.Workspace, tc.state)); err == nil {
				t.Fatalf("%s is still in the workspace", tc.state)
			}
			out, _ := hostGit(s, s.Workspace, tc.resume...)
			if _, err := os.Stat(mark); err == nil {
				t.Fatalf("git %s ran the sandbox's strategy:\n%s", strings.Join(tc.resume, " "), out)
			}
			useHostGit(t, s, s.Workspace, mark)
		})
	}
}

// TestGitGuardHookScripts: a hook of the user's that runs a file of the
// workspace (a script by its path, husky v4's run.js) is held, but the file
// is not: when the sandbox changed it, the launcher names the file and the
// hook when the run ends, and leaves it in place.
func TestGitGuardHookScripts(t *testing.T) {
	t.Parallel()
	requireEngine(t)
	s, _, payload, p := gitCase(t, true)
	ws := s.Workspace
	isolationWriteFile(t, filepath.Join(ws, ".git", "hooks", "pre-commit"), "#!/bin/sh\n./scripts/check.sh\n")
	isolationWriteFile(t, filepath.Join(ws, "scripts", "check.sh"), "#!/bin/sh\nexit 0\n")
	// husky v4 as it installs itself: the hooks source husky.sh, which
	// runs node_modules/husky/run.js, which reads package.json.
	isolationWriteFile(t, filepath.Join(ws, ".git", "hooks", "pre-push"), "#!/bin/sh\n# husky\n\n# Created by Husky v4.3.8 (https://github.com/typicode/husky#readme)\n\n. \"$(dirname \"$0\")/husky.sh\"\n")
	isolationWriteFile(t, filepath.Join(ws, ".git", "hooks", "husky.sh"), "#!/bin/sh\nscriptPath=\"node_modules/husky/run.js\"\nhookName=`basename \"$0\"`\nif [ -f \"$scriptPath\" ]; then\n  node_modules/run-node/run-node \"$scriptPath\" $hookName \"$*\"\nfi\n")
	isolationWriteFile(t, filepath.Join(ws, "node_modules", "husky", "run.js"), "require('./lib/runner/bin')\n")
	isolationWriteFile(t, filepath.Join(ws, "package.json"), "{}\n")
	r := probeFS(s, p, "write scripts/check.sh #!/bin/sh\n"+payload+"\n",
		"write node_modules/husky/run.js require('child_process').execSync('"+payload+"')\n",
		"write README changed, and no hook runs it\n")
	probeOK(t, r, "done 3")
	for _, want := range []string{
		filepath.Join(ws, "scripts/check.sh") + ": changed in the sandbox, and a hook of yours runs it",
		"(.git/hooks/pre-commit runs scripts/check.sh)",
		filepath.Join(ws, "node_modules/husky/run.js") + ": changed in the sandbox",
	} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("the launcher did not say %q:\n%s", want, r)
		}
	}
	if strings.Contains(r.Stderr, filepath.Join(ws, "README")) || strings.Contains(r.Stderr, "put aside") {
		t.Errorf("the launcher reported more than the hooks' files:\n%s", r)
	}
	isolationHasContent(t, filepath.Join(ws, "scripts", "check.sh"), "#!/bin/sh\n"+payload+"\n")
}

// TestGitGuardPersistentExec: in a persistent sandbox, what one exec
// leaves (a commondir to a git directory of its own) is judged when the
// exec ends, before the user's git runs between two execs; the next exec
// judges only what changed while it ran.
func TestGitGuardPersistentExec(t *testing.T) {
	t.Parallel()
	requireEngine(t)
	s, mark, payload, p := gitCase(t, true)
	ps := up(t, s, p)
	ops := append([]string{"/probe", "fs", "write .git/commondir ../evil"}, fakeGitDir("evil", testenv.EvilGitConfig(payload))...)
	r := ps.exec("", ops...)
	probeOK(t, r, "done")
	wantReported(t, r, ".git/commondir", "evil/config")
	useHostGit(t, s, s.Workspace, mark)
	useHostGit(t, s, filepath.Join(s.Workspace, "evil"), mark)

	r = ps.exec("", "/probe", "fs", "write notes.txt work\n")
	probeOK(t, r, "done 1")
	if strings.Contains(r.Stderr, "warning") {
		t.Fatalf("the second exec judged again what the first left, or its own work:\n%s", r)
	}
	if r := s.Run("", "down", ps.name); r.Code != 0 || strings.Contains(r.Stderr, "warning") {
		t.Fatalf("down:\n%s", r)
	}
	useHostGit(t, s, s.Workspace, mark)
}
