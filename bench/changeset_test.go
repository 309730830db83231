//go:build linux

package bench

// The changeset benchmark: reviewing and applying what a sandbox in
// changeset mode wrote, on a large workspace, against git and cp doing the
// same on the same files.
//
// A workspace of 100,000 small text files (100 directories of 10
// subdirectories of 100 files, 10 lines each) gets 1,000 changes: a third
// of the files modified (one line changed, one appended), a third deleted,
// a third added beside existing files. They are made through a real
// overlay mount of the changeset (as the engine mounts it) when this
// process may mount one (root), else written by hand into the upper
// directory; then the changeset is sealed. A git repository of the same
// files gets the same changes in its working tree (added files with
// `git add -N`, so that git diff shows them).
//
// Timed, as processes, alternating the arms round by round, medians:
//   - `propio-sandbox diff --stat ID` against `git diff --stat`;
//   - `propio-sandbox apply ID` against `cp -a` of the 666 added and
//     modified files plus `rm` of the 334 deleted ones (apply also syncs
//     each file to disk before renaming it into place; cp does not).
// Printed once: Create (the base manifest of the 100,000 files) and Seal.
// The target: diff --stat under 1 s.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/changeset"
	"github.com/propio/propio-sandbox/internal/testenv"
	"golang.org/x/sys/unix"
)

// DiffTarget is the longest acceptable median of `propio-sandbox diff --stat`.
const DiffTarget = time.Second

const (
	benchDirs    = 100
	benchSubdirs = 10
	benchFiles   = 100 // per subdirectory: 100*10*100 = 100,000 files
	benchChanges = 1000
)

type plannedChange struct {
	path string // relative
	kind changeset.Kind
	orig []byte // the original content (modified, deleted)
	mod  int64  // its mtime, ns
	new  []byte // the result (modified, added)
}

func benchFile(d, s, f int) string {
	return fmt.Sprintf("d%03d/s%02d/f%03d.txt", d, s, f)
}

func benchContent(n int) []byte {
	var b bytes.Buffer
	for l := range 10 {
		fmt.Fprintf(&b, "file %d line %d: some text of a source file\n", n, l)
	}
	return b.Bytes()
}

// TestChangesetBench runs with PROPIO_BENCH=1; PROPIO_BENCH_N sets the rounds (default 5).
func TestChangesetBench(t *testing.T) {
	rounds := benchRounds(t, "changeset benchmark", "makes 200,000 files, about a minute", 5)
	launcher := testenv.Launcher(t)
	base := t.TempDir()
	if real, err := filepath.EvalSymlinks(base); err == nil {
		base = real
	}
	ws, repo, state := filepath.Join(base, "ws"), filepath.Join(base, "repo"), filepath.Join(base, "state")
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + base, "XDG_STATE_HOME=" + state, "XDG_CONFIG_HOME=" + filepath.Join(base, "config"),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_COUNT=2", "GIT_CONFIG_KEY_0=gc.auto", "GIT_CONFIG_VALUE_0=0", "GIT_CONFIG_KEY_1=maintenance.auto", "GIT_CONFIG_VALUE_1=false",
		"GIT_AUTHOR_NAME=b", "GIT_AUTHOR_EMAIL=b@b", "GIT_COMMITTER_NAME=b", "GIT_COMMITTER_EMAIL=b@b"}

	start := time.Now()
	n := 0
	for d := range benchDirs {
		for s := range benchSubdirs {
			for _, root := range []string{ws, repo} {
				if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("d%03d/s%02d", d, s)), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for f := range benchFiles {
				data := benchContent(n)
				for _, root := range []string{ws, repo} {
					if err := os.WriteFile(filepath.Join(root, benchFile(d, s, f)), data, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				n++
			}
		}
	}
	run(t, repo, env, "git", "init", "-q")
	run(t, repo, env, "git", "add", "-A")
	run(t, repo, env, "git", "commit", "-q", "-m", "base")
	t.Logf("setup: %d files twice and a git commit in %.1fs", n, time.Since(start).Seconds())

	// 1,000 changes spread over the tree.
	var plan []plannedChange
	for i := range benchChanges {
		k := i * (n / benchChanges)
		d, s, f := k/(benchSubdirs*benchFiles), k/benchFiles%benchSubdirs, k%benchFiles
		p := benchFile(d, s, f)
		switch i % 3 {
		case 0:
			orig := benchContent(k)
			mod := bytes.Replace(orig, []byte("line 4:"), []byte("line four:"), 1)
			plan = append(plan, plannedChange{path: p, kind: changeset.KindModified, orig: orig, new: append(mod, "appended\n"...)})
		case 1:
			plan = append(plan, plannedChange{path: p, kind: changeset.KindDeleted, orig: benchContent(k)})
		case 2:
			plan = append(plan, plannedChange{path: strings.TrimSuffix(p, ".txt") + "-new.txt", kind: changeset.KindAdded, new: benchContent(k + 1_000_000)})
		}
	}
	for i := range plan {
		if plan[i].orig != nil {
			fi, err := os.Stat(filepath.Join(ws, plan[i].path))
			if err != nil {
				t.Fatal(err)
			}
			plan[i].mod = fi.ModTime().UnixNano()
		}
	}

	store := changeset.Store{Dir: filepath.Join(state, "propio-sandbox", "changesets")}
	start = time.Now()
	c, err := store.Create(ws, "bench", changeset.ModeOverlay, []changeset.Mount{{Name: changeset.WorkspaceMount, Source: ws, Target: "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	createTime := time.Since(start)
	how := makeChanges(t, c, ws, plan)
	added := []string{"add", "-N", "--"}
	for _, pc := range plan {
		applyPlanned(t, repo, pc)
		if pc.kind == changeset.KindAdded {
			added = append(added, pc.path)
		}
	}
	run(t, repo, env, "git", added...)
	start = time.Now()
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	sealTime := time.Since(start)
	pristine := filepath.Join(base, "pristine-changeset")
	run(t, base, env, "cp", "-a", c.Dir(), pristine)

	// diff --stat, both arms in turn; their summary lines must agree.
	var propioDiff, gitDiff, libDiff []time.Duration
	var propioOut, gitOut string
	for range rounds {
		d, out := timed(t, ws, env, launcher, "diff", "--stat", c.ID)
		propioDiff, propioOut = append(propioDiff, d), out
		d, out = timed(t, repo, env, "git", "diff", "--stat")
		gitDiff, gitOut = append(gitDiff, d), out
		start := time.Now()
		cs, err := c.Changes()
		if err != nil {
			t.Fatal(err)
		}
		fds, err := c.Diff(cs)
		if err != nil {
			t.Fatal(err)
		}
		changeset.WriteStat(&bytes.Buffer{}, fds, 80)
		libDiff = append(libDiff, time.Since(start))
	}
	if a, b := summary(propioOut), summary(gitOut); a != b || a == "" {
		t.Errorf("diff --stat summary %q, git's %q", a, b)
	}

	// apply against cp + rm of the same files.
	stage := filepath.Join(base, "stage")
	var deleted []string
	for _, pc := range plan {
		if pc.kind == changeset.KindDeleted {
			deleted = append(deleted, pc.path)
			continue
		}
		p := filepath.Join(stage, pc.path)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, pc.new, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list := filepath.Join(base, "deleted.txt")
	os.WriteFile(list, []byte(strings.Join(deleted, "\n")+"\n"), 0o644)
	var propioApply, cpApply []time.Duration
	for range rounds {
		restore(t, ws, plan)
		run(t, base, env, "rm", "-rf", c.Dir())
		run(t, base, env, "cp", "-a", pristine, c.Dir())
		d, out := timed(t, ws, env, launcher, "apply", c.ID)
		if !strings.Contains(out, "fully applied") {
			t.Fatalf("apply: %s", out)
		}
		propioApply = append(propioApply, d)
		checkApplied(t, ws, plan)
		restore(t, ws, plan)
		d, _ = timed(t, ws, env, "sh", "-c", "cp -a "+stage+"/. . && xargs -d '\\n' rm -- < "+list)
		cpApply = append(cpApply, d)
		checkApplied(t, ws, plan)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "changeset of %d files with %d changes (%s), %d alternating rounds, medians:\n", n, len(plan), how, rounds)
	fmt.Fprintf(&b, "  create (base manifest of %d files): %.3fs   seal: %.3fs\n", n, createTime.Seconds(), sealTime.Seconds())
	fmt.Fprintf(&b, "  %-40s %8s   %-32s %8s %7s\n", "propio-sandbox", "seconds", "reference", "seconds", "ratio")
	row := func(name string, d []time.Duration, ref string, r []time.Duration) {
		fmt.Fprintf(&b, "  %-40s %8.3f   %-32s %8.3f %6.2fx\n", name, median(d).Seconds(), ref, median(r).Seconds(), float64(median(d))/float64(median(r)))
	}
	row("diff --stat ID (process)", propioDiff, "git diff --stat", gitDiff)
	row("  the same as library calls", libDiff, "git diff --stat", gitDiff)
	row("apply ID (process, fsync per file)", propioApply, "cp -a + rm (no fsync)", cpApply)
	fmt.Fprintf(&b, "  diff --stat summary: %s", summary(propioOut))
	t.Logf("\n%s", b.String())
	if m := median(propioDiff); m > DiffTarget {
		t.Errorf("diff --stat took %.3fs (median), over the target %.1fs", m.Seconds(), DiffTarget.Seconds())
	}
}

// makeChanges makes the planned changes in the changeset: through a real
// overlay mount when possible, else by hand in the upper directory.
func makeChanges(t *testing.T, c *changeset.Changeset, ws string, plan []plannedChange) string {
	t.Helper()
	merged := t.TempDir()
	opts := "lowerdir=" + ws + ",upperdir=" + c.UpperDir(changeset.WorkspaceMount) + ",workdir=" + c.WorkDir(changeset.WorkspaceMount)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err == nil {
		for _, pc := range plan {
			applyPlanned(t, merged, pc)
		}
		if err := unix.Unmount(merged, 0); err != nil {
			t.Fatal(err)
		}
		return "made through a real overlay mount"
	} else {
		t.Logf("no overlay mount (%v): writing the upper directory by hand", err)
	}
	upper := c.UpperDir(changeset.WorkspaceMount)
	for _, pc := range plan {
		p := filepath.Join(upper, pc.path)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if pc.kind == changeset.KindDeleted {
			if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
				t.Skipf("cannot make overlay whiteouts (%v): run as root", err)
			}
			continue
		}
		if err := os.WriteFile(p, pc.new, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return "written by hand into the upper directory"
}

func applyPlanned(t *testing.T, root string, pc plannedChange) {
	t.Helper()
	p := filepath.Join(root, pc.path)
	var err error
	if pc.kind == changeset.KindDeleted {
		err = os.Remove(p)
	} else {
		err = os.WriteFile(p, pc.new, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// restore puts the workspace back as it was, mtimes included, so that
// apply finds the originals unchanged by their stat, as after a real run.
func restore(t *testing.T, ws string, plan []plannedChange) {
	t.Helper()
	for _, pc := range plan {
		p := filepath.Join(ws, pc.path)
		if pc.kind == changeset.KindAdded {
			os.Remove(p)
			continue
		}
		if err := os.WriteFile(p, pc.orig, 0o644); err != nil {
			t.Fatal(err)
		}
		mt := time.Unix(0, pc.mod)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
}

func checkApplied(t *testing.T, ws string, plan []plannedChange) {
	t.Helper()
	for _, pc := range plan {
		data, err := os.ReadFile(filepath.Join(ws, pc.path))
		if pc.kind == changeset.KindDeleted {
			if err == nil {
				t.Fatalf("%s is still there", pc.path)
			}
			continue
		}
		if err != nil || !bytes.Equal(data, pc.new) {
			t.Fatalf("%s: not the result (%v)", pc.path, err)
		}
	}
}

func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

var summaryRE = regexp.MustCompile(`(?m)^ \d+ files? changed.*$`)

func summary(out string) string { return summaryRE.FindString(out) }
