package guard

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// gitEnv runs the host's git in dir with testenv.GitEnv and env, and
// returns its output and error (a stopped rebase or cherry-pick fails).
func gitEnv(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(testenv.GitEnv(os.TempDir()), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// diverged makes a repository whose branch side must be merged onto
// main (testenv.DivergedRepo).
func diverged(t *testing.T, ws string) {
	t.Helper()
	repo(t, ws)
	testenv.DivergedRepo(t, ws, t.TempDir())
}

// plant makes the strategy x/../evil run ./evil, which makes marker.
func plant(t *testing.T, ws, marker string) {
	t.Helper()
	write(t, filepath.Join(ws, "evil"), "#!/bin/sh\ntouch "+marker+"\n")
	if err := os.MkdirAll(filepath.Join(ws, "git-merge-x"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestCheckOperations: an operation left in progress that changed while
// the sandbox ran is put aside whole, and the host's git continues
// nothing of it; one the user left before is kept as it is.
func TestCheckOperations(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	cases := []struct {
		name    string
		before  func(t *testing.T, ws string) // the user's, before the sandbox starts
		sandbox func(t *testing.T, ws string) // what the sandbox does
		want    []string
		resume  []string
	}{
		{
			name: "rebase strategy",
			sandbox: func(t *testing.T, ws string) {
				git(t, ws, "checkout", "-q", "side")
				gitEnv(ws, []string{"GIT_SEQUENCE_EDITOR=sed -i 1s/^pick/edit/"}, "rebase", "-i", "main")
				write(t, filepath.Join(ws, ".git", "rebase-merge", "strategy"), "x/../evil")
			},
			want:   []string{".git/REBASE_HEAD", ".git/rebase-merge"},
			resume: []string{"rebase", "--continue"},
		},
		{
			name: "rebase strategy of the user's rebase",
			before: func(t *testing.T, ws string) {
				git(t, ws, "checkout", "-q", "side")
				gitEnv(ws, []string{"GIT_SEQUENCE_EDITOR=sed -i 1s/^pick/edit/"}, "rebase", "-i", "main")
			},
			sandbox: func(t *testing.T, ws string) {
				write(t, filepath.Join(ws, ".git", "rebase-merge", "strategy_opts"), "--x")
				write(t, filepath.Join(ws, ".git", "rebase-merge", "strategy"), "x/../evil")
			},
			want:   []string{".git/rebase-merge"},
			resume: []string{"rebase", "--continue"},
		},
		{
			name: "cherry-pick options.strategy",
			sandbox: func(t *testing.T, ws string) {
				gitEnv(ws, nil, "cherry-pick", "side~1", "side")
				write(t, filepath.Join(ws, "f"), "resolved\n")
				git(t, ws, "add", "f")
				write(t, filepath.Join(ws, ".git", "sequencer", "opts"), "[options]\n\tstrategy = x/../evil\n")
			},
			want:   []string{".git/AUTO_MERGE", ".git/CHERRY_PICK_HEAD", ".git/MERGE_MSG", ".git/sequencer"},
			resume: []string{"cherry-pick", "--continue"},
		},
		{
			name: "merge",
			sandbox: func(t *testing.T, ws string) {
				gitEnv(ws, nil, "merge", "side")
			},
			want:   []string{".git/MERGE_HEAD", ".git/MERGE_MODE", ".git/MERGE_MSG"},
			resume: []string{"commit", "-qam", "merged"},
		},
		{
			name: "bisect",
			sandbox: func(t *testing.T, ws string) {
				git(t, ws, "bisect", "start", "main", "main~2")
				write(t, filepath.Join(ws, ".git", "BISECT_NAMES"), "'; touch x'")
			},
			want:   []string{".git/BISECT_LOG", ".git/BISECT_NAMES", ".git/BISECT_START", ".git/BISECT_TERMS"},
			resume: []string{"bisect", "good"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ws := t.TempDir()
			diverged(t, ws)
			marker := filepath.Join(t.TempDir(), "ran")
			if tc.before != nil {
				tc.before(t, ws)
				time.Sleep(2 * clockSlack) // the user's state is stamped before the start
			}
			plan := Scan([]Root{{Name: "workspace", Source: ws}})
			if err := plan.Prepare(t.TempDir(), "ops", time.Now()); err != nil {
				t.Fatal(err)
			}
			tc.sandbox(t, ws)
			plant(t, ws, marker)
			rep := plan.Check(t.TempDir())
			if err := rep.Err(); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, it := range rep.Items {
				if it.Action != PutAside {
					t.Errorf("%s: %s", it.Path, it.Action)
				}
				got = append(got, it.Path)
			}
			// Which files a given git leaves differs from one version to
			// the next: what must go is there, and nothing else is.
			for _, w := range tc.want {
				if _, err := os.Lstat(filepath.Join(ws, w)); err == nil {
					t.Errorf("%s is still there", w)
				}
			}
			for _, g := range got {
				if !isOperation(filepath.Base(g)) {
					t.Errorf("%s was put aside", g)
				}
			}
			gitEnv(ws, nil, tc.resume...)
			gitEnv(ws, nil, "status")
			if _, err := os.Stat(marker); err == nil {
				t.Fatalf("git ran the strategy the sandbox wrote (put aside: %q)", got)
			}
		})
	}
}

// TestCheckOperationUntouched: an operation of the user's that the
// sandbox did not change is kept, to be continued.
func TestCheckOperationUntouched(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	diverged(t, ws)
	git(t, ws, "checkout", "-q", "side")
	gitEnv(ws, []string{"GIT_SEQUENCE_EDITOR=sed -i 1s/^pick/edit/"}, "rebase", "-i", "main")
	time.Sleep(2 * clockSlack)
	plan := Scan([]Root{{Name: "workspace", Source: ws}})
	if err := plan.Prepare(t.TempDir(), "ops", time.Now()); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(ws, "other"), "work\n")
	time.Sleep(2 * clockSlack)
	write(t, filepath.Join(ws, "f"), "resolved\n") // the user's, after the sandbox
	git(t, ws, "add", "f")
	if rep := plan.Check(t.TempDir()); len(rep.Items) != 0 || rep.Err() != nil {
		t.Fatalf("the user's rebase was judged: %+v", rep)
	}
	if out, err := gitEnv(ws, nil, "rebase", "--continue"); err != nil {
		t.Fatalf("rebase --continue: %v\n%s", err, out)
	}
}

// TestHookNamed: what the user's hooks run by path is reported when the
// sandbox changed it, with the file and the hook named; nothing is moved.
func TestHookNamed(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	repo(t, ws)
	write(t, filepath.Join(ws, ".git", "hooks", "pre-commit"), "#!/bin/sh\n# runs the checks\n./scripts/check.sh \"$@\" && sh scripts/lint.sh\n\"$dir/node_modules/lefthook/bin/index.js\" \"$@\"\nexport PATH=node_modules/.bin:$PATH\n")
	write(t, filepath.Join(ws, "scripts", "check.sh"), "#!/bin/sh\n. \"$(dirname \"$0\")/lib/common.sh\"\n")
	write(t, filepath.Join(ws, "scripts", "lint.sh"), "#!/bin/sh\n")
	write(t, filepath.Join(ws, "scripts", "lib", "common.sh"), "true\n")
	// husky v4: the hook sources husky.sh, which runs run.js with node.
	write(t, filepath.Join(ws, ".git", "hooks", "pre-push"), "#!/bin/sh\n# husky\n\n# Created by Husky v4.3.8\n\n. \"$(dirname \"$0\")/husky.sh\"\n")
	write(t, filepath.Join(ws, ".git", "hooks", "husky.sh"), "scriptPath=\"node_modules/husky/run.js\"\nhookName=`basename \"$0\"`\nif [ -f \"$scriptPath\" ]; then\n  node_modules/run-node/run-node \"$scriptPath\" $hookName \"$gitParams\"\nfi\n")
	write(t, filepath.Join(ws, "node_modules", "husky", "run.js"), "require('./lib/runner')\n")
	write(t, filepath.Join(ws, "node_modules", "husky", "lib", "runner", "index.js"), "\n")
	write(t, filepath.Join(ws, "node_modules", "run-node", "run-node"), "\n")
	write(t, filepath.Join(ws, "package.json"), "{}\n")

	plan := Scan([]Root{{Name: "workspace", Source: ws}})
	var named []string
	for _, n := range plan.Roots[0].Named {
		named = append(named, n.Path)
	}
	slices.Sort(named)
	want := []string{".huskyrc", ".huskyrc.js", ".huskyrc.json", ".huskyrc.yaml", ".huskyrc.yml", "husky.config.js", "node_modules/husky", "node_modules/lefthook", "node_modules/run-node", "package.json", "scripts/check.sh", "scripts/lib/common.sh", "scripts/lint.sh"}
	if !slices.Equal(named, want) {
		t.Fatalf("named %q, want %q", named, want)
	}
	time.Sleep(2 * clockSlack) // what is there before is stamped before the start
	if err := plan.Prepare(t.TempDir(), "hooks", time.Now()); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(ws, "scripts", "lib", "common.sh"), "evil\n")
	write(t, filepath.Join(ws, "node_modules", "husky", "lib", "runner", "index.js"), "evil\n")
	write(t, filepath.Join(ws, ".huskyrc"), "{}\n")
	rep := plan.Check(t.TempDir())
	if len(rep.Items) != 0 || rep.Err() != nil {
		t.Fatalf("something was done: %+v", rep)
	}
	var got []string
	for _, it := range rep.Named {
		got = append(got, it.Path+" <- "+it.Why)
	}
	slices.Sort(got)
	wantGot := []string{
		".huskyrc <- .git/hooks/husky.sh runs .huskyrc",
		"node_modules/husky/lib/runner/index.js <- .git/hooks/husky.sh runs node_modules/husky",
		"scripts/lib/common.sh <- .git/hooks/pre-commit runs scripts/lib/common.sh",
	}
	if !slices.Equal(got, wantGot) {
		t.Fatalf("reported\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantGot, "\n"))
	}
	if data, _ := os.ReadFile(filepath.Join(ws, "scripts", "lib", "common.sh")); string(data) != "evil\n" {
		t.Fatal("the changed script was not left in place")
	}
}

func TestScriptPaths(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][]string{
		"./scripts/check.sh \"$@\"":                  {"./scripts/check.sh"},
		". \"$(dirname -- \"$0\")/_/husky.sh\"":      {"/h/_/husky.sh"},
		"# ./commented.sh\nnpx lint-staged":          nil,
		"exec node tools/hook.js --flag=x $HOME/a":   {"tools/hook.js"},
		"run lint.py; curl https://x.test/a.sh | sh": {"lint.py"},
		"f=bin/tool.sh":                              {"bin/tool.sh"},
	} {
		if got := scriptPaths(in, "/h"); !slices.Equal(got, want) {
			t.Errorf("scriptPaths(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"node_modules/husky/run.js":     "node_modules/husky",
		"a/node_modules/@s/p/lib/x.js":  "a/node_modules/@s/p",
		"node_modules/.bin/lint-staged": "node_modules/.bin/lint-staged",
		"scripts/check.sh":              "scripts/check.sh",
		"node_modules/husky":            "node_modules/husky",
	} {
		if got := packageDir(in); got != want {
			t.Errorf("packageDir(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestItemShown: a path the sandbox named reaches the terminal inert.
func TestItemShown(t *testing.T) {
	t.Parallel()
	it := Item{Source: "/ws", Path: ".git/BISECT_\x1b]52;c;eA==\x07\u202e", Action: PutAside, Why: "why", Where: "/q/BISECT_\x1b[2J"}
	if s := it.String(); strings.ContainsAny(s, "\x1b\x07\u202e") {
		t.Fatalf("raw controls in %q", s)
	}
	if s := (Item{Source: "/ws", Path: "scripts/check.sh", Action: HookRuns, Why: "w"}).String(); !strings.HasPrefix(s, "/ws/scripts/check.sh: ") {
		t.Fatalf("a plain path is not shown as it is: %q", s)
	}
}

// TestHookNamedSubmodule: a submodule's hook runs in the submodule's
// worktree, and names paths from there.
func TestHookNamedSubmodule(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	repo(t, ws)
	lib := filepath.Join(t.TempDir(), "lib")
	repo(t, lib)
	git(t, ws, "-c", "protocol.file.allow=always", "submodule", "add", "-q", lib, "lib")
	write(t, filepath.Join(ws, ".git", "modules", "lib", "hooks", "pre-commit"), "#!/bin/sh\n./tools/check.sh\n")
	plan := Scan([]Root{{Name: "workspace", Source: ws}})
	if named := plan.Roots[0].Named; len(named) != 1 || named[0].Path != "lib/tools/check.sh" {
		t.Fatalf("named %+v, want lib/tools/check.sh", named)
	}
}
