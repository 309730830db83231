package e2e

// Changesets against the real engine: a sandbox in changeset mode leaves
// the workspace as it was, `diff` shows what the agent did, `apply` makes it
// so (all of it, or the paths named), conflicts are refused unless --force,
// an apply killed halfway completes when run again, and one changeset spans
// the workspace and mounted repositories, across resumed runs. Every test
// runs twice: with the overlay the engine mounts, and with the copy
// (PROPIO_SANDBOX_CHANGESET_MODE=copy).

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// seed is the workspace every changeset test starts from.
var seed = map[string]string{
	"modified.txt":      "line 1\nline 2\n",
	"deleted.txt":       "to be deleted\n",
	"old-name.txt":      "renamed, content kept\n",
	"script.sh":         "#!/bin/sh\necho hi\n",
	"untouched.txt":     "never changed\n",
	"binary.bin":        "\x00\x01\x02binary\xff",
	"olddir/a.txt":      "a\n",
	"olddir/sub/b.txt":  "b\n",
	"recreated/old.txt": "old content\n",
	"keep/inner.txt":    "inner\n",
}

// agentOps is what the agent does, as probe fs operations: create, modify,
// delete, rename, chmod, symlink, delete a directory, delete one and make it
// again, make a new tree.
var agentOps = []string{
	"write new.txt created by the agent\n",
	"append modified.txt line 3 from the agent\n",
	"rm deleted.txt",
	"mv old-name.txt new-name.txt",
	"chmod 755 script.sh",
	"symlink modified.txt link-to-modified",
	"rmrf olddir",
	"rmrf recreated",
	"mkdir recreated",
	"write recreated/fresh.txt fresh\n",
	"mkdir newdir/sub",
	"write newdir/sub/deep.txt deep\n",
	"writehex binary.bin 006368616e676564ff01",
	"chmod 600 keep/inner.txt",
}

// changedPaths are the paths the agent's operations change, as diff names them.
var changedPaths = []string{"new.txt", "modified.txt", "deleted.txt", "old-name.txt", "new-name.txt", "script.sh",
	"link-to-modified", "olddir/a.txt", "olddir/sub/b.txt", "recreated/old.txt", "recreated/fresh.txt", "newdir/sub/deep.txt", "binary.bin", "keep/inner.txt"}

// changesetModes are the realisations every test runs with.
var changesetModes = []string{"overlay", "copy"}

// changesetSandbox is a sandbox whose changesets are realised as mode says.
func changesetSandbox(t *testing.T, mode string) *sandbox {
	t.Helper()
	s := newSandbox(t)
	s.Env = append(s.Env, "PROPIO_SANDBOX_CHANGESET_MODE="+mode)
	writeTree(t, s.Workspace, seed)
	return s
}

// writeTree writes files (slash paths relative to dir).
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("untouched.txt", filepath.Join(dir, "old-link")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
}

// treeState describes every entry under root but those below skip: its
// type, permission bits, and content hash or link target.
func treeState(t *testing.T, root string, skip ...string) map[string]string {
	t.Helper()
	return describeTree(t, root, false, skip...)
}

// exactState is treeState with each entry's owner and modification time (to
// the nanosecond) too: what proves that nothing touched a tree.
func exactState(t *testing.T, root string) map[string]string {
	t.Helper()
	return describeTree(t, root, true)
}

func describeTree(t *testing.T, root string, exact bool, skip ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		for _, s := range skip {
			if rel == s {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%v", fi.Mode())
		if exact {
			st := fi.Sys().(*syscall.Stat_t)
			desc += fmt.Sprintf(" %d:%d %d", st.Uid, st.Gid, fi.ModTime().UnixNano())
		}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %x", sha256.Sum256(b))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// treeHash is one hash of a whole tree state.
func treeHash(state map[string]string) string {
	keys := make([]string, 0, len(state))
	for k := range state {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%s\x00%s\n", k, state[k])
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// treeDiff lists the paths whose state differs, for failure messages.
func treeDiff(want, got map[string]string) string {
	var b strings.Builder
	seen := map[string]bool{}
	for k, w := range want {
		seen[k] = true
		if g, ok := got[k]; !ok {
			fmt.Fprintf(&b, "  %s: missing (want %s)\n", k, w)
		} else if g != w {
			fmt.Fprintf(&b, "  %s: %s, want %s\n", k, g, w)
		}
	}
	for k, g := range got {
		if !seen[k] {
			fmt.Fprintf(&b, "  %s: unexpected %s\n", k, g)
		}
	}
	return b.String()
}

var changesetID = regexp.MustCompile(`changeset (\S+) (made|continued)`)

// runChangeset runs the agent's operations (or ops) in changeset mode and
// returns the changeset's id. In overlay mode, an engine that cannot mount
// an overlay here skips the test.
func runChangeset(t *testing.T, s *sandbox, profile string, extra []string, ops ...string) string {
	t.Helper()
	args := append([]string{"run", "-p", profile, "--changeset"}, extra...)
	r := s.Run("", append(append(args, "--", "fs"), ops...)...)
	if r.Code != 0 && strings.Contains(r.Stderr, "cannot mount an overlay here") {
		t.Skipf("the engine cannot mount an overlay here:\n%s", r.Stderr)
	}
	if r.Code != 0 || !strings.Contains(r.Stdout, fmt.Sprintf("done %d", len(ops))) {
		t.Fatalf("run in changeset mode:\n%s", r)
	}
	m := changesetID.FindStringSubmatch(r.Stderr)
	if m == nil {
		t.Fatalf("run printed no changeset id:\n%s", r)
	}
	for _, want := range []string{"diff " + m[1], "apply " + m[1], "discard " + m[1]} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("run does not print the next command %q:\n%s", want, r.Stderr)
		}
	}
	return m[1]
}

// cli runs a propio-sandbox command and fails the test unless it exits 0.
func cli(t *testing.T, s *sandbox, args ...string) Result {
	t.Helper()
	r := s.Run("", args...)
	if r.Code != 0 {
		t.Fatalf("%s %v:\n%s", launcher, args, r)
	}
	return r
}

// rwResult is the tree the agent's operations make when they run on the
// workspace itself (mode rw), in a copy of the seed.
func rwResult(t *testing.T, ops ...string) map[string]string {
	t.Helper()
	s := newSandbox(t)
	writeTree(t, s.Workspace, seed)
	p := s.Profile(probeOffline)
	r := s.Run("", append([]string{"run", "-p", p, "--", "fs"}, ops...)...)
	if r.Code != 0 {
		t.Fatalf("the agent's operations in mode rw:\n%s", r)
	}
	return treeState(t, s.Workspace)
}

func TestChangesetRunLeavesWorkspaceAndDiffShowsEachChange(t *testing.T) {
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			before := exactState(t, s.Workspace)
			id := runChangeset(t, s, s.Profile(probeOffline), nil, agentOps...)
			after := exactState(t, s.Workspace)
			if treeHash(before) != treeHash(after) {
				t.Fatalf("the workspace changed in changeset mode:\n%s", treeDiff(before, after))
			}

			diff := cli(t, s, "diff", id).Stdout
			stat := cli(t, s, "diff", "--stat", id).Stdout
			for _, p := range changedPaths {
				if !strings.Contains(diff, p) {
					t.Errorf("diff does not show %s:\n%s", p, diff)
				}
				if !strings.Contains(stat, p) {
					t.Errorf("diff --stat does not show %s:\n%s", p, stat)
				}
			}
			for _, want := range []string{"+line 3 from the agent", "-to be deleted", "+created by the agent", "old mode 100644", "new mode 100755", "modified.txt"} {
				if !strings.Contains(diff, want) {
					t.Errorf("diff does not show %q:\n%s", want, diff)
				}
			}
			for _, p := range []string{"untouched.txt", "old-link", "keep/other"} {
				if strings.Contains(stat, p+" ") || strings.Contains(stat, p+"\t") || strings.Contains(stat, p+"\n") {
					t.Errorf("diff --stat shows %s, which the agent did not change:\n%s", p, stat)
				}
			}
			js := cli(t, s, "diff", "--json", id).Stdout
			var doc any
			if err := json.Unmarshal([]byte(js), &doc); err != nil {
				t.Fatalf("diff --json is not JSON: %v\n%s", err, js)
			}
			for _, p := range changedPaths {
				if !strings.Contains(js, `"`+p+`"`) {
					t.Errorf("diff --json does not name %s", p)
				}
			}
			if out := cli(t, s, "changes").Stdout; !strings.Contains(out, id) {
				t.Errorf("changes does not list %s:\n%s", id, out)
			}
			cli(t, s, "discard", id)
			if out := cli(t, s, "changes").Stdout; strings.Contains(out, id) {
				t.Errorf("changes lists %s after discard:\n%s", id, out)
			}
			if after := exactState(t, s.Workspace); treeHash(before) != treeHash(after) {
				t.Fatalf("discard changed the workspace:\n%s", treeDiff(before, after))
			}
		})
	}
}

func TestChangesetApply(t *testing.T) {
	want := rwResult(t, agentOps...)
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			t.Run("all", func(t *testing.T) {
				s := changesetSandbox(t, mode)
				id := runChangeset(t, s, s.Profile(probeOffline), nil, agentOps...)
				cli(t, s, "apply", id)
				if got := treeState(t, s.Workspace); treeHash(got) != treeHash(want) {
					t.Fatalf("apply did not make the agent's result (as in mode rw):\n%s", treeDiff(want, got))
				}
			})
			t.Run("selected", func(t *testing.T) {
				s := changesetSandbox(t, mode)
				before := treeState(t, s.Workspace)
				id := runChangeset(t, s, s.Profile(probeOffline), nil, agentOps...)
				cli(t, s, "apply", id, "new.txt", "deleted.txt", "script.sh")
				got := treeState(t, s.Workspace)
				expect := map[string]string{}
				for k, v := range before {
					expect[k] = v
				}
				delete(expect, "deleted.txt")
				expect["new.txt"] = want["new.txt"]
				expect["script.sh"] = want["script.sh"]
				if treeHash(got) != treeHash(expect) {
					t.Fatalf("apply of new.txt, deleted.txt and script.sh changed something else or missed one:\n%s", treeDiff(expect, got))
				}
				// The rest is still there to apply.
				cli(t, s, "apply", id)
				if got := treeState(t, s.Workspace); treeHash(got) != treeHash(want) {
					t.Fatalf("applying the rest did not make the agent's result:\n%s", treeDiff(want, got))
				}
			})
		})
	}
}

func TestChangesetConflict(t *testing.T) {
	want := rwResult(t, agentOps...)
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			id := runChangeset(t, s, s.Profile(probeOffline), nil, agentOps...)
			// The user edits an original the agent changed too, after the run.
			mine := "the user's own edit\n"
			edited := filepath.Join(s.Workspace, "modified.txt")
			if err := os.WriteFile(edited, []byte(mine), 0o644); err != nil {
				t.Fatal(err)
			}
			r := s.Run("", "apply", id)
			if r.Code == 0 {
				t.Fatalf("apply over a changed original succeeded:\n%s", r)
			}
			if !strings.Contains(r.Stdout+r.Stderr, "modified.txt") || !strings.Contains(strings.ToLower(r.Stdout+r.Stderr), "conflict") {
				t.Errorf("apply does not list the conflict on modified.txt:\n%s", r)
			}
			if b, _ := os.ReadFile(edited); string(b) != mine {
				t.Fatalf("apply overwrote the user's edit: %q", b)
			}
			cli(t, s, "apply", "--force", id)
			if got := treeState(t, s.Workspace); treeHash(got) != treeHash(want) {
				t.Fatalf("apply --force did not make the agent's result:\n%s", treeDiff(want, got))
			}
		})
	}
}

func TestChangesetApplyKilledAndRerun(t *testing.T) {
	ops := append(append([]string(nil), agentOps...), "mkdir many")
	for i := range 30 {
		ops = append(ops, fmt.Sprintf("write many/file-%02d.txt content %d\n", i, i))
	}
	want := rwResult(t, ops...)
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			id := runChangeset(t, s, s.Profile(probeOffline), nil, ops...)

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := s.Command(ctx, "apply", id)
			cmd.Env = append(cmd.Env, "PROPIO_SANDBOX_APPLY_PAUSE=300ms")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Kill it once a few files, not all, are there.
			applied := func() int {
				entries, _ := os.ReadDir(filepath.Join(s.Workspace, "many"))
				return len(entries)
			}
			deadline := time.Now().Add(time.Minute)
			for applied() < 3 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			n := applied()
			if n < 3 || n >= 30 {
				t.Fatalf("apply was killed after %d of 30 files; want some, not all", n)
			}
			if got := treeState(t, s.Workspace); treeHash(got) == treeHash(want) {
				t.Fatal("the killed apply had finished")
			}
			cli(t, s, "apply", id)
			if got := treeState(t, s.Workspace); treeHash(got) != treeHash(want) {
				t.Fatalf("apply re-run after a kill did not make the agent's result:\n%s", treeDiff(want, got))
			}
		})
	}
}

// gitInit makes dir a git repository with one commit of what it holds.
func gitInit(t *testing.T, dir string) {
	t.Helper()
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@example.test", "commit", "-q", "-m", "seed"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
}

// A workspace that is no git repository, and two mounted repositories in
// changeset mode: one changeset spans the three; run --changeset --resume
// adds to it; apply changes all three.
func TestChangesetAcrossMountsAndResume(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("needs git to make the repositories")
	}
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			if _, err := os.Stat(filepath.Join(s.Workspace, ".git")); err == nil {
				t.Fatal("the workspace is a git repository")
			}
			repoA, repoB := filepath.Join(s.Home, "repo-a"), filepath.Join(s.Home, "repo-b")
			for _, r := range []string{repoA, repoB} {
				writeTree(t, r, map[string]string{"README": "repo\n", "src/main.go": "package main\n"})
				gitInit(t, r)
			}
			beforeWS, beforeA, beforeB := exactState(t, s.Workspace), exactState(t, repoA), exactState(t, repoB)
			p := s.Profile(probeOffline + "workspace: {mode: changeset}\nmounts:\n" +
				"  - {source: " + repoA + ", target: /repos/a, mode: changeset}\n" +
				"  - {source: " + repoB + ", target: /repos/b, mode: changeset}\n")
			id := runChangeset(t, s, p, nil, "write new.txt ws\n", "append /repos/a/README from the agent\n", "rm /repos/b/src/main.go", "write /repos/b/added.txt b\n")
			for name, c := range map[string]struct {
				dir    string
				before map[string]string
			}{"workspace": {s.Workspace, beforeWS}, "repo a": {repoA, beforeA}, "repo b": {repoB, beforeB}} {
				if got := exactState(t, c.dir); treeHash(got) != treeHash(c.before) {
					t.Fatalf("%s changed in changeset mode:\n%s", name, treeDiff(c.before, got))
				}
			}
			// Resumed, with the same mounts: the changeset grows.
			if id2 := runChangeset(t, s, p, []string{"--resume", id}, "write /repos/a/second.txt second run\n", "rm new.txt", "write again.txt ws2\n"); id2 != id {
				t.Fatalf("run --resume %s made changeset %s", id, id2)
			}
			stat := cli(t, s, "diff", "--stat", id).Stdout
			for _, want := range []string{"again.txt", "README", "second.txt", "main.go", "added.txt"} {
				if !strings.Contains(stat, want) {
					t.Errorf("diff --stat of the changeset across mounts lacks %s:\n%s", want, stat)
				}
			}
			if strings.Contains(stat, "new.txt") {
				t.Errorf("diff --stat shows new.txt, which the resumed run removed again:\n%s", stat)
			}
			// Resuming with other mounts is refused, naming the difference.
			other := s.Profile(probeOffline + "workspace: {mode: changeset}\nmounts:\n  - {source: " + repoA + ", target: /repos/a, mode: changeset}\n")
			r := s.Run("", "run", "-p", other, "--changeset", "--resume", id, "--", "fs")
			if r.Code == 0 || !strings.Contains(r.Stderr, "cannot be resumed with this profile") || !strings.Contains(r.Stderr, "mount-1") {
				t.Errorf("resuming with other mounts:\n%s", r)
			}
			cli(t, s, "apply", id)
			if b, err := os.ReadFile(filepath.Join(repoA, "README")); err != nil || string(b) != "repo\nfrom the agent\n" {
				t.Errorf("repo a README after apply: %q, %v", b, err)
			}
			if b, err := os.ReadFile(filepath.Join(repoA, "second.txt")); err != nil || string(b) != "second run\n" {
				t.Errorf("repo a second.txt after apply: %q, %v", b, err)
			}
			if _, err := os.Lstat(filepath.Join(repoB, "src", "main.go")); !os.IsNotExist(err) {
				t.Errorf("repo b src/main.go after apply: %v, want deleted", err)
			}
			if b, err := os.ReadFile(filepath.Join(s.Workspace, "again.txt")); err != nil || string(b) != "ws2\n" {
				t.Errorf("workspace again.txt after apply: %q, %v", b, err)
			}
			if _, err := os.Lstat(filepath.Join(s.Workspace, "new.txt")); !os.IsNotExist(err) {
				t.Errorf("workspace new.txt after apply: %v, want absent", err)
			}
			// The repositories' own metadata is the agent's to leave alone.
			for _, r := range []string{repoA, repoB} {
				cmd := exec.Command("git", "status", "--porcelain")
				cmd.Dir = r
				if out, err := cmd.CombinedOutput(); err != nil || len(out) == 0 {
					t.Errorf("git status in %s after apply: %v %q, want the agent's changes", r, err, out)
				}
			}
		})
	}
}

// held starts a launcher in changeset mode whose sandbox writes a file,
// then sleeps for hold; it returns once the sandbox runs.
func held(t *testing.T, s *sandbox, profile string, hold string, extra ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	args := append([]string{"run", "-p", profile, "--changeset"}, extra...)
	cmd := s.Command(ctx, append(args, "--", "fs", "write during.txt x\n", "sleep "+hold)...)
	var out, errb testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "sleeping") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "sleeping") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the sandbox did not start:\n%s\n%s", out.String(), errb.String())
	}
	return cmd
}

var idPattern = regexp.MustCompile(`\d{8}-\d{6}-[0-9a-f]+`)

// A launcher killed while its sandbox runs leaves the changeset running
// (changes shows it) and its sandbox behind. run --resume removes that
// sandbox first (its overlay must not stay mounted) and goes on; gc removes
// a killed launcher's sandbox, changeset volumes included; discard --force
// removes a changeset left running. While a live launcher's sandbox writes
// to a changeset, resuming it is refused.
func TestChangesetKilledLauncher(t *testing.T) {
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			p := s.Profile(probeOffline)
			cmd := held(t, s, p, "60s")
			if left := s.Leftovers(); !strings.Contains(strings.Join(left, "\n"), "volume ") {
				t.Errorf("no changeset volume while the sandbox runs: %v", left)
			}
			changes := cli(t, s, "changes").Stdout
			id := idPattern.FindString(changes)
			if id == "" || !strings.Contains(changes, "running") {
				t.Fatalf("changes does not show the running changeset:\n%s", changes)
			}
			r := s.Run("", "run", "-p", p, "--changeset", "--resume", id, "--", "fs")
			if r.Code == 0 || !strings.Contains(r.Stderr, "in use") {
				t.Errorf("resuming a changeset a live launcher's sandbox writes to:\n%s", r)
			}
			killWatchdog(t, cmd.Process.Pid)
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			if len(s.Leftovers()) == 0 {
				t.Fatal("the killed launcher's sandbox is gone already; the test proves nothing")
			}

			// Resumed at once: the killed launcher's sandbox goes first.
			if got := runChangeset(t, s, p, []string{"--resume", id}, "write after.txt y\n"); got != id {
				t.Fatalf("run --resume %s made %s", id, got)
			}
			if left := s.Leftovers(); len(left) > 0 {
				t.Fatalf("resuming left the killed launcher's sandbox: %v", left)
			}
			stat := cli(t, s, "diff", "--stat", id).Stdout
			if !strings.Contains(stat, "after.txt") {
				t.Errorf("diff --stat after the resumed run lacks after.txt:\n%s", stat)
			}
			if mode == "overlay" && !strings.Contains(stat, "during.txt") {
				t.Errorf("an overlay keeps what the killed run wrote; diff --stat lacks during.txt:\n%s", stat)
			}

			// Killed again, then gc.
			cmd = held(t, s, p, "60s", "--resume", id)
			killWatchdog(t, cmd.Process.Pid)
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			cli(t, s, "gc")
			if left := s.Leftovers(); len(left) > 0 {
				t.Fatalf("gc left the killed launcher's resources: %v", left)
			}
			if changes := cli(t, s, "changes").Stdout; !strings.Contains(changes, "running") {
				t.Errorf("changes does not show the changeset left running:\n%s", changes)
			}
			cli(t, s, "discard", "--force", id)
			if out := cli(t, s, "changes").Stdout; strings.Contains(out, id) {
				t.Errorf("changes lists %s after discard --force:\n%s", id, out)
			}
		})
	}
}

// Hidden and read-only workspace paths stay so in changeset mode (they are
// mounts on top of the changeset's): a hidden file reads empty, a read-only
// one cannot be written, neither shows in the changeset, and apply leaves
// both as they are.
func TestChangesetHideAndReadonly(t *testing.T) {
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			writeTree(t, s.Workspace, map[string]string{".env": "SECRET=1\n", "locked/config": "locked\n"})
			before := treeState(t, s.Workspace)
			p := s.Profile(probeOffline + "workspace:\n  hide: [.env]\n  readonly: [locked]\n")
			r := s.Run("", "run", "-p", p, "--changeset", "--", "read", ".env")
			if r.Code != 0 && strings.Contains(r.Stderr, "cannot mount an overlay here") {
				t.Skipf("the engine cannot mount an overlay here:\n%s", r.Stderr)
			}
			if r.Code != 0 || strings.Contains(r.Stdout, "SECRET") {
				t.Fatalf("reading the hidden .env in changeset mode:\n%s", r)
			}
			probeFails(t, s.Run("", "run", "-p", p, "--changeset", "--", "write", "locked/config", "changed"), "read-only file system")
			id := runChangeset(t, s, p, nil, "write new.txt n\n")
			stat := cli(t, s, "diff", "--stat", id).Stdout
			if !strings.Contains(stat, "new.txt") || strings.Contains(stat, ".env") || strings.Contains(stat, "locked") {
				t.Errorf("diff --stat with hidden and read-only paths:\n%s", stat)
			}
			cli(t, s, "apply", id)
			after := treeState(t, s.Workspace)
			delete(after, "new.txt")
			if treeHash(after) != treeHash(before) {
				t.Fatalf("apply changed more than new.txt:\n%s", treeDiff(before, after))
			}
		})
	}
}

// A run that changes nothing keeps no changeset, and says so in one line;
// diff and apply without an ID then take the newest changeset that holds
// changes, not a newer empty one.
func TestChangesetEmptyNotKept(t *testing.T) {
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			p := s.Profile(probeOffline)
			store := filepath.Join(s.Home, ".local", "state", "propio-sandbox", "changesets")
			nothing := func() {
				t.Helper()
				r := s.Run("", "run", "-p", p, "--changeset", "--", "read", "untouched.txt")
				if r.Code != 0 && strings.Contains(r.Stderr, "cannot mount an overlay here") {
					t.Skipf("the engine cannot mount an overlay here:\n%s", r.Stderr)
				}
				if r.Code != 0 || !strings.Contains(r.Stderr, "propio-sandbox: the sandbox changed nothing; no changeset kept\n") || changesetID.MatchString(r.Stderr) {
					t.Fatalf("a run that changes nothing, want one line saying no changeset is kept:\n%s", r)
				}
			}
			nothing()
			if entries, _ := os.ReadDir(store); len(entries) > 0 {
				t.Fatalf("changesets kept for a run that changed nothing: %v", entries)
			}
			id := runChangeset(t, s, p, nil, "write new.txt n\n")
			nothing()
			if stat := cli(t, s, "diff", "--stat").Stdout; !strings.Contains(stat, "new.txt") {
				t.Errorf("diff without an ID after a run that changed nothing, want %s's new.txt:\n%s", id, stat)
			}
			if out := cli(t, s, "apply").Stdout; !strings.Contains(out, id) {
				t.Errorf("apply without an ID, want %s applied:\n%s", id, out)
			}
			if _, err := os.Stat(filepath.Join(s.Workspace, "new.txt")); err != nil {
				t.Errorf("apply did not make new.txt: %v", err)
			}
		})
	}
}

// A sandbox that fails to start (here the engine refuses a capability)
// leaves no changeset, container or volume.
func TestChangesetFailedStartLeavesNothing(t *testing.T) {
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			p := s.Profile(probeOffline + "security: {cap_add: [CAP_NOT_A_CAPABILITY]}\n")
			r := s.Run("", "run", "-p", p, "--changeset", "--", "fs", "write x.txt x\n")
			if r.Code == 0 {
				t.Fatalf("a sandbox with an unknown capability ran:\n%s", r)
			}
			if strings.Contains(r.Stderr, "changeset ") && changesetID.MatchString(r.Stderr) {
				t.Errorf("run printed a changeset for a sandbox that did not run:\n%s", r)
			}
			store := filepath.Join(s.Home, ".local", "state", "propio-sandbox", "changesets")
			if entries, _ := os.ReadDir(store); len(entries) > 0 {
				t.Errorf("changesets left in %s: %v", store, entries)
			}
			if left := s.Leftovers(); len(left) > 0 {
				t.Errorf("resources left: %v", left)
			}
		})
	}
}

// Ctrl+C while the sandbox runs stops it, and what it wrote until then is
// kept in the changeset, sealed for review like any other.
func TestChangesetInterrupted(t *testing.T) {
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			p := s.Profile(probeOffline)
			before := exactState(t, s.Workspace)
			cmd := held(t, s, p, "60s")
			cmd.Process.Signal(syscall.SIGINT)
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("an interrupted sandbox: %v", err)
			}
			changes := cli(t, s, "changes").Stdout
			id := idPattern.FindString(changes)
			if id == "" || strings.Contains(changes, "running") {
				t.Fatalf("changes after an interrupted run, want it sealed:\n%s", changes)
			}
			if stat := cli(t, s, "diff", "--stat", id).Stdout; !strings.Contains(stat, "during.txt") {
				t.Errorf("diff --stat after an interrupted run lacks during.txt:\n%s", stat)
			}
			if after := exactState(t, s.Workspace); treeHash(after) != treeHash(before) {
				t.Fatalf("the workspace changed:\n%s", treeDiff(before, after))
			}
		})
	}
}

// The default profile's network mode, allowlist, runs a gateway next to
// the sandbox: changeset mode works there too, and leaves nothing.
func TestChangesetAllowlist(t *testing.T) {
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")
			id := runChangeset(t, s, p, nil, "write new.txt n\n", "rm deleted.txt")
			stat := cli(t, s, "diff", "--stat", id).Stdout
			if !strings.Contains(stat, "new.txt") || !strings.Contains(stat, "deleted.txt") {
				t.Errorf("diff --stat:\n%s", stat)
			}
		})
	}
}

// A launcher that is not root, with a rootful engine (a member of the
// docker group): the overlay's marks must be readable by it (userxattr),
// and what the kernel leaves in the overlay's work directory removable, so
// that apply makes the agent's result (a directory deleted and made again
// included) and then removes the changeset. Run as root, the test becomes
// nobody with the engine socket's group.
func TestChangesetNotRootLauncher(t *testing.T) {
	requireEngine(t)
	setpriv, err := exec.LookPath("setpriv")
	if os.Geteuid() != 0 || err != nil {
		t.Skip("needs root and setpriv to become another user")
	}
	sock := engineSocket(t)
	st, err := os.Stat(sock)
	if err != nil {
		t.Skipf("engine socket: %v", err)
	}
	gid := st.Sys().(*syscall.Stat_t).Gid
	if gid == 0 || st.Mode().Perm()&0o060 != 0o060 {
		t.Skipf("%s is not open to a group another user could be in", sock)
	}
	const uid = 65534
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			base, err := os.MkdirTemp("", "propio-e2e-notroot-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(base) })
			ws, home, bin := filepath.Join(base, "ws"), filepath.Join(base, "home"), filepath.Join(base, "propio-sandbox")
			writeTree(t, ws, seed)
			if err := os.MkdirAll(home, 0o755); err != nil {
				t.Fatal(err)
			}
			exe, err := os.ReadFile(launcher)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(bin, exe, 0o755); err != nil {
				t.Fatal(err)
			}
			profile := filepath.Join(base, "profile.yaml")
			if err := os.WriteFile(profile, []byte("image: "+ProbeImage+"\n"+probeOffline), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{base, ws, home} {
				filepath.WalkDir(p, func(p string, d fs.DirEntry, err error) error {
					if err == nil {
						os.Lchown(p, uid, uid)
					}
					return err
				})
			}
			os.Chmod(base, 0o755)
			before := exactState(t, ws)
			command := func(ctx context.Context, args ...string) *exec.Cmd {
				cmd := exec.CommandContext(ctx, setpriv, append([]string{"--reuid", fmt.Sprint(uid), "--regid", fmt.Sprint(uid), "--groups", fmt.Sprint(gid), bin}, args...)...)
				cmd.Dir = ws
				cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "PROPIO_SANDBOX_CHANGESET_MODE=" + mode}
				if h := os.Getenv("DOCKER_HOST"); h != "" {
					cmd.Env = append(cmd.Env, "DOCKER_HOST="+h)
				}
				return cmd
			}
			as := func(args ...string) Result {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				return runCmd(t, ctx, command(ctx, args...))
			}
			r := as(append([]string{"run", "-p", profile, "--changeset", "--", "fs"}, agentOps...)...)
			if r.Code != 0 && strings.Contains(r.Stderr, "cannot mount an overlay here") {
				t.Skipf("the engine cannot mount an overlay here:\n%s", r.Stderr)
			}
			m := changesetID.FindStringSubmatch(r.Stderr)
			if r.Code != 0 || m == nil {
				t.Fatalf("run as uid %d:\n%s", uid, r)
			}
			if after := exactState(t, ws); treeHash(after) != treeHash(before) {
				t.Fatalf("the workspace changed:\n%s", treeDiff(before, after))
			}
			if r := as("apply", m[1]); r.Code != 0 {
				t.Fatalf("apply as uid %d:\n%s", uid, r)
			}
			want := rwResult(t, agentOps...)
			if got := treeState(t, ws); treeHash(got) != treeHash(want) {
				t.Fatalf("apply as uid %d did not make the agent's result:\n%s", uid, treeDiff(want, got))
			}
			store := filepath.Join(home, ".local", "state", "propio-sandbox", "changesets")
			if entries, _ := os.ReadDir(store); len(entries) > 0 {
				t.Errorf("the applied changeset is still in %s: %v", store, entries)
			}

			// A killed launcher's sandbox, removed by gc; the changeset it
			// left running, removed by discard --force.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := command(ctx, "run", "-p", profile, "--changeset", "--", "fs", "rm new.txt", "rmrf newdir", "sleep 60s")
			var out testenv.Buffer
			cmd.Stdout = &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); !strings.Contains(out.String(), "sleeping") && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond)
			}
			killWatchdog(t, cmd.Process.Pid)
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			if !strings.Contains(out.String(), "sleeping") {
				t.Fatalf("the sandbox did not start: %s", out.String())
			}
			if r := as("gc"); r.Code != 0 {
				t.Fatalf("gc as uid %d:\n%s", uid, r)
			}
			id := idPattern.FindString(as("changes").Stdout)
			if r := as("discard", "--force", id); id == "" || r.Code != 0 {
				t.Fatalf("discard --force %q as uid %d:\n%s", id, uid, r)
			}
			if entries, _ := os.ReadDir(store); len(entries) > 0 {
				t.Errorf("the discarded changeset is still in %s: %v", store, entries)
			}
			for _, kind := range [][]string{{"ps", "-aq"}, {"volume", "ls", "-q"}} {
				if left, _ := docker(append(kind, "--filter", "label=dev.propio-sandbox.workspace="+ws)...); strings.TrimSpace(left) != "" {
					t.Errorf("left behind: %v %s", kind, left)
				}
			}
		})
	}
}

// A declared check of a profile in changeset mode runs before any
// changeset exists: it sees the workspace read-only, so it can never write
// to the originals.
func TestChangesetDeclaredCheckReadOnly(t *testing.T) {
	s := changesetSandbox(t, "auto")
	before := exactState(t, s.Workspace)
	p := s.Profile(probeOffline + "workspace: {mode: changeset}\nchecks:\n  - {name: writes, run: [write, checked.txt, x]}\n")
	r := s.Run("", "run", "-p", p, "--", "fs", "write new.txt n\n")
	if r.Code != 3 || !strings.Contains(r.Stderr, "read-only file system") {
		t.Fatalf("a declared check writing the workspace of a changeset profile:\n%s", r)
	}
	if after := exactState(t, s.Workspace); treeHash(after) != treeHash(before) {
		t.Fatalf("the workspace changed:\n%s", treeDiff(before, after))
	}
	if entries, _ := os.ReadDir(filepath.Join(s.Home, ".local", "state", "propio-sandbox", "changesets")); len(entries) > 0 {
		t.Errorf("a changeset was made for a run that failed its checks: %v", entries)
	}
}

// A sandbox stopped by resources.timeout (exit 124) keeps what it wrote in
// its changeset, sealed for review.
func TestChangesetTimeout(t *testing.T) {
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s := changesetSandbox(t, mode)
			p := s.Profile(probeOffline + "resources: {timeout: 3s}\n")
			r := s.Run("", "run", "-p", p, "--changeset", "--", "fs", "write before-timeout.txt x\n", "sleep 60s")
			if r.Code != 0 && strings.Contains(r.Stderr, "cannot mount an overlay here") {
				t.Skip(r.Stderr)
			}
			m := changesetID.FindStringSubmatch(r.Stderr)
			if r.Code != 124 || m == nil {
				t.Fatalf("a changeset sandbox that times out, want exit 124 and its changeset:\n%s", r)
			}
			if stat := cli(t, s, "diff", "--stat", m[1]).Stdout; !strings.Contains(stat, "before-timeout.txt") {
				t.Errorf("diff --stat after a timeout lacks before-timeout.txt:\n%s", stat)
			}
		})
	}
}

// A mount inside a workspace in changeset mode would put its mount point in
// the changeset: refused, in the profile (positioned) and in
// PROPIO_SANDBOX_MOUNTS, before anything is made.
func TestChangesetMountInsideWorkspaceRefused(t *testing.T) {
	s := changesetSandbox(t, "auto")
	src := t.TempDir()
	p := s.Profile(probeOffline + "mounts:\n  - {source: " + src + ", target: /workspace/home}\n")
	r := s.Run("", "run", "-p", p, "--changeset", "--", "fs")
	if r.Code == 0 || !strings.Contains(r.Stderr, "mounts[0].target: /workspace/home is inside the workspace") || !strings.Contains(r.Stderr, "profile.yaml:") {
		t.Errorf("a profile mount inside a changeset workspace:\n%s", r)
	}
	s.Env = append(s.Env, "PROPIO_SANDBOX_MOUNTS="+src+":/workspace/home")
	r = s.Run("", "run", "-p", s.Profile(probeOffline), "--changeset", "--", "fs")
	if r.Code == 0 || !strings.Contains(r.Stderr, "PROPIO_SANDBOX_MOUNTS mounts /workspace/home inside the workspace") {
		t.Errorf("an extra mount inside a changeset workspace:\n%s", r)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.Home, ".local", "state", "propio-sandbox", "changesets")); len(entries) > 0 {
		t.Errorf("changesets made: %v", entries)
	}
}
