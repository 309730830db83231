package changeset

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// snapshot describes every entry of a tree: type, mode and content.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "symlink " + target
		case info.IsDir():
			out[rel] = fmt.Sprintf("dir %v", info.Mode().Perm())
		case info.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			out[rel] = fmt.Sprintf("file %v %q", info.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), data)
		default:
			out[rel] = "other " + info.Mode().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffSnapshots(want, got map[string]string) string {
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		if want[k] != got[k] {
			fmt.Fprintf(&b, "  %s: want %q, got %q\n", k, want[k], got[k])
		}
	}
	return b.String()
}

func write(t *testing.T, root, rel, content string, mode fs.FileMode) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, root, rel string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, rel), 0o755); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, root, rel, target string) {
	t.Helper()
	p := filepath.Join(root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// whiteout makes an overlayfs whiteout, which needs CAP_MKNOD.
func whiteout(t *testing.T, root, rel string) {
	t.Helper()
	p := filepath.Join(root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := unix.Mknod(p, unix.S_IFCHR|0o000, 0); err != nil {
		t.Skipf("cannot make a whiteout (character device 0:0) without root: %v", err)
	}
}

func opaque(t *testing.T, root, rel string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := unix.Lsetxattr(p, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		if err := unix.Lsetxattr(p, "user.overlay.opaque", []byte("y"), 0); err != nil {
			t.Skipf("cannot set the opaque xattr: %v", err)
		}
	}
}

// original is the source tree the tests start from.
func original(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	write(t, src, "keep.txt", "keep\n", 0o644)
	write(t, src, "mod.txt", "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n", 0o644)
	write(t, src, "del.txt", "delete me\n", 0o644)
	write(t, src, "dir/a", "a\n", 0o644)
	write(t, src, "dir/sub/b", "b\n", 0o644)
	write(t, src, "opq/x", "x\n", 0o644)
	write(t, src, "opq/y", "y\n", 0o644)
	write(t, src, "run.sh", "#!/bin/sh\n", 0o644)
	write(t, src, "touched.txt", "same\n", 0o644)
	write(t, src, "f2d", "file then dir\n", 0o644)
	write(t, src, "d2f/c", "c\n", 0o644)
	write(t, src, "bin.dat", "\x00\x01\x02", 0o644)
	mkdir(t, src, "emptydir")
	symlink(t, src, "link", "keep.txt")
	symlink(t, src, "linkchg", "keep.txt")
	return src
}

// result is what the sandbox leaves: the original with all the changes.
func applyEdits(t *testing.T, root string) {
	t.Helper()
	write(t, root, "mod.txt", "one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\nten\neleven\n", 0o644)
	os.Remove(filepath.Join(root, "del.txt"))
	os.RemoveAll(filepath.Join(root, "dir"))
	os.RemoveAll(filepath.Join(root, "opq"))
	write(t, root, "opq/y", "new y\n", 0o644)
	os.Chmod(filepath.Join(root, "run.sh"), 0o755)
	os.Remove(filepath.Join(root, "linkchg"))
	symlink(t, root, "linkchg", "mod.txt")
	symlink(t, root, "newlink", "keep.txt")
	os.Remove(filepath.Join(root, "f2d"))
	write(t, root, "f2d/inner", "inner\n", 0o644)
	os.RemoveAll(filepath.Join(root, "d2f"))
	write(t, root, "d2f", "now a file\n", 0o600)
	write(t, root, "new/deep/file.txt", "new\n", 0o644)
	write(t, root, "bin.dat", "\x00\x01\x02\x03", 0o644)
	os.Remove(filepath.Join(root, "emptydir"))
}

// upperFor makes by hand what overlayfs leaves in the upper directory for applyEdits.
func upperFor(t *testing.T, src, upper string) {
	t.Helper()
	write(t, upper, "mod.txt", "one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\nten\neleven\n", 0o644)
	whiteout(t, upper, "del.txt")
	whiteout(t, upper, "dir")
	write(t, upper, "opq/y", "new y\n", 0o644)
	opaque(t, upper, "opq")
	write(t, upper, "run.sh", "#!/bin/sh\n", 0o755)
	write(t, upper, "touched.txt", "same\n", 0o644) // copied up, unchanged
	symlink(t, upper, "linkchg", "mod.txt")
	symlink(t, upper, "newlink", "keep.txt")
	write(t, upper, "f2d/inner", "inner\n", 0o644)
	write(t, upper, "d2f", "now a file\n", 0o600)
	write(t, upper, "new/deep/file.txt", "new\n", 0o644)
	write(t, upper, "bin.dat", "\x00\x01\x02\x03", 0o644)
	whiteout(t, upper, "emptydir")
}

func kinds(cs []Change) string {
	var s []string
	for _, c := range cs {
		s = append(s, string(c.Kind)+" "+c.Path)
	}
	return strings.Join(s, "\n")
}

const wantKinds = `modified bin.dat
type d2f
deleted d2f/c
deleted del.txt
deleted dir
deleted dir/a
deleted dir/sub
deleted dir/sub/b
deleted emptydir
type f2d
added f2d/inner
modified linkchg
modified mod.txt
added new
added new/deep
added new/deep/file.txt
added newlink
deleted opq/x
modified opq/y
mode run.sh`

func newStore(t *testing.T) Store {
	return Store{Dir: filepath.Join(t.TempDir(), "changesets")}
}

func TestSealOverlayApply(t *testing.T) {
	src := original(t)
	want := original(t)
	applyEdits(t, want)
	st := newStore(t)
	c, err := st.Create(src, "test", ModeOverlay, []Mount{{Name: WorkspaceMount, Source: src, Target: "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	upperFor(t, src, c.UpperDir(WorkspaceMount))
	before := snapshot(t, src)
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	if c.State != StateReady {
		t.Errorf("state %s after Seal", c.State)
	}
	cs, err := c.Changes()
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(cs); got != wantKinds {
		t.Errorf("changes:\n%s\nwant:\n%s", got, wantKinds)
	}
	for _, ch := range cs {
		if ch.BaseChanged {
			t.Errorf("%s: base changed", ch.Path)
		}
		if ch.Before.Type == TypeFile && ch.Before.SHA256 == "" {
			t.Errorf("%s: no hash of the original", ch.Path)
		}
	}
	if d := diffSnapshots(before, snapshot(t, src)); d != "" {
		t.Fatalf("Seal changed the original:\n%s", d)
	}
	checkDiffOutput(t, c, cs)

	res, err := c.Apply(cs, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 0 || !res.Removed {
		t.Errorf("apply: %d conflicts, removed %v", len(res.Conflicts), res.Removed)
	}
	if d := diffSnapshots(snapshot(t, want), snapshot(t, src)); d != "" {
		t.Errorf("after apply, the original differs from the result:\n%s", d)
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the applied changeset is still in the store: %v", err)
	}
}

func checkDiffOutput(t *testing.T, c *Changeset, cs []Change) {
	t.Helper()
	fds, err := c.Diff(cs)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteUnified(&buf, fds); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"diff --git a/mod.txt b/mod.txt\n--- a/mod.txt\n+++ b/mod.txt\n@@ -1,6 +1,6 @@\n one\n two\n-three\n+THREE\n four\n five\n six\n@@ -8,3 +8,4 @@\n eight\n nine\n ten\n+eleven\n",
		"diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n",
		"diff --git a/del.txt b/del.txt\ndeleted file mode 100644\n--- a/del.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-delete me\n",
		"diff --git a/new/deep/file.txt b/new/deep/file.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new/deep/file.txt\n@@ -0,0 +1 @@\n+new\n",
		"diff --git a/linkchg b/linkchg\n--- a/linkchg\n+++ b/linkchg\n@@ -1 +1 @@\n-keep.txt\n\\ No newline at end of file\n+mod.txt\n\\ No newline at end of file\n",
		"diff --git a/newlink b/newlink\nnew file mode 120000\n",
		"Binary files a/bin.dat and b/bin.dat differ (3 -> 4 bytes)\n",
		"directory d2f: deleted\ndiff --git a/d2f b/d2f\nnew file mode 100644\n",
		"directory new/deep: added, mode 0755\n",
		"directory dir/sub: deleted\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the diff lacks\n%s\n--- diff:\n%s", want, out)
			break
		}
	}
	if strings.Contains(out, "touched.txt") {
		t.Errorf("an unchanged copied-up file shows in the diff")
	}
	buf.Reset()
	if err := WriteStat(&buf, fds, 80); err != nil {
		t.Fatal(err)
	}
	stat := buf.String()
	for _, want := range []string{" mod.txt ", "| 2 +-\n", "Bin 3 -> 4 bytes", "run.sh", "| 0\n", " 15 files changed, 8 insertions(+), 9 deletions(-)\n"} {
		if !strings.Contains(stat, want) {
			t.Errorf("--stat lacks %q:\n%s", want, stat)
		}
	}
	data, err := json.Marshal(c.NewReport(fds))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		ID    string
		Files []map[string]any
	}
	if err := json.Unmarshal(data, &r); err != nil || r.ID != c.ID || len(r.Files) != len(cs) {
		t.Fatalf("json report: %v, %s", err, data)
	}
	for _, f := range r.Files {
		if f["path"] == "run.sh" && (f["mode_before"] != "0644" || f["mode_after"] != "0755" || f["kind"] != "mode") {
			t.Errorf("json run.sh: %v", f)
		}
	}
}

func TestSealCopyApply(t *testing.T) {
	src := original(t)
	want := original(t)
	applyEdits(t, want)
	st := newStore(t)
	c, err := st.Create(src, "test", ModeCopy, []Mount{{Name: WorkspaceMount, Source: src, Target: "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	tree := c.TreeDir(WorkspaceMount)
	os.Remove(tree)
	if out, err := exec.Command("cp", "-a", src, tree).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	applyEdits(t, tree)
	// A copy that only touched a file (new mtime, same content) is no change.
	os.Chtimes(filepath.Join(tree, "touched.txt"), time.Now(), time.Now().Add(time.Hour))
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	cs, err := c.Changes()
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(cs); got != wantKinds {
		t.Errorf("changes:\n%s\nwant:\n%s", got, wantKinds)
	}
	if _, err := c.Apply(cs, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := diffSnapshots(snapshot(t, want), snapshot(t, src)); d != "" {
		t.Errorf("after apply, the original differs from the result:\n%s", d)
	}
}

func sealed(t *testing.T) (*Changeset, string) {
	t.Helper()
	src := original(t)
	c, err := newStore(t).Create(src, "test", ModeOverlay, []Mount{{Name: WorkspaceMount, Source: src, Target: "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	upperFor(t, src, c.UpperDir(WorkspaceMount))
	return c, src
}

func TestConflicts(t *testing.T) {
	c, src := sealed(t)
	// Changed during the run: known at Seal.
	time.Sleep(10 * time.Millisecond)
	write(t, src, "mod.txt", "changed by the user during the run\n", 0o644)
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	// Changed after the run: found at apply.
	write(t, src, "keep.txt", "keep\n", 0o644) // rewritten, same content: no conflict
	write(t, src, "del.txt", "edited after the run\n", 0o644)
	write(t, src, "new/deep/file.txt", "new\n", 0o644) // already what the changeset makes
	cs, _ := c.Changes()
	res, err := c.Apply(cs, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var conflicts []string
	for _, cf := range res.Conflicts {
		conflicts = append(conflicts, cf.Path)
	}
	if got := strings.Join(conflicts, " "); got != "del.txt mod.txt" {
		t.Errorf("conflicts: %s, want del.txt mod.txt", got)
	}
	if data, _ := os.ReadFile(filepath.Join(src, "mod.txt")); string(data) != "changed by the user during the run\n" {
		t.Errorf("a conflicting file was overwritten: %q", data)
	}
	if data, _ := os.ReadFile(filepath.Join(src, "del.txt")); string(data) != "edited after the run\n" {
		t.Errorf("a conflicting file was deleted")
	}
	if res.Removed || c.State != StatePartial || res.Remaining != 2 {
		t.Errorf("after a partial apply: removed %v, state %s, remaining %d", res.Removed, c.State, res.Remaining)
	}
	left, _ := c.Changes()
	if got := kinds(left); got != "deleted del.txt\nmodified mod.txt" {
		t.Errorf("left after partial apply:\n%s", got)
	}
	again, err := newStore(t).Get(c.ID)
	if err == nil {
		t.Fatalf("another store found %s", again.ID)
	}
	res, err = c.Apply(left, ApplyOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Removed || len(res.Conflicts) != 0 {
		t.Errorf("forced apply: removed %v, conflicts %v", res.Removed, res.Conflicts)
	}
	if _, err := os.Stat(filepath.Join(src, "del.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("forced apply left del.txt")
	}
}

func TestApplySelectedAndRerun(t *testing.T) {
	c, src := sealed(t)
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	all, _ := c.Changes()
	for _, arg := range []string{"new", "/workspace/opq", src + "/run.sh"} {
		ref, err := c.Resolve(arg, "/elsewhere")
		if err != nil {
			t.Fatal(err)
		}
		sel := Select(all, []Ref{ref})
		if len(sel) == 0 {
			t.Fatalf("%s selects nothing", arg)
		}
		if _, err := c.Apply(sel, ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	left, _ := c.Changes()
	for _, ch := range left {
		if ch.Path == "new" || strings.HasPrefix(ch.Path, "new/") || strings.HasPrefix(ch.Path, "opq/") || ch.Path == "run.sh" {
			t.Errorf("%s still listed after it was applied", ch.Path)
		}
	}
	if len(left) != len(all)-6 {
		t.Errorf("%d left of %d, want 6 fewer", len(left), len(all))
	}
	if fi, err := os.Stat(filepath.Join(src, "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("run.sh not chmod'ed: %v", fi.Mode())
	}
	// A killed apply: some paths done, not recorded. Re-running finishes it.
	os.Remove(filepath.Join(c.Dir(), appliedFile))
	os.Remove(filepath.Join(src, "del.txt"))
	write(t, src, "mod.txt", "one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\nten\neleven\n", 0o644)
	os.WriteFile(c.tempName(filepath.Join(src, "bin.dat")), []byte("half"), 0o600)
	all, _ = c.Changes()
	res, err := c.Apply(all, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 0 || !res.Removed {
		t.Errorf("re-run: conflicts %v, removed %v", res.Conflicts, res.Removed)
	}
	want := original(t)
	applyEdits(t, want)
	if d := diffSnapshots(snapshot(t, want), snapshot(t, src)); d != "" {
		t.Errorf("after the re-run, the original differs from the result:\n%s", d)
	}
}

func TestStore(t *testing.T) {
	st := newStore(t)
	if _, err := st.Latest("/x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("empty store: %v", err)
	}
	ws := t.TempDir()
	write(t, ws, "f", "f\n", 0o644)
	var ids []string
	for range 3 {
		c, err := st.Create(ws, "p", ModeOverlay, []Mount{{Name: WorkspaceMount, Source: ws, Target: "/workspace"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
		fi, err := os.Stat(c.Dir())
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("changeset dir mode %v, %v", fi.Mode(), err)
		}
	}
	list, err := st.List()
	if err != nil || len(list) != 3 {
		t.Fatalf("list: %d, %v", len(list), err)
	}
	for i, c := range list {
		if c.ID != ids[i] || c.State != StateRunning {
			t.Errorf("list[%d] = %s %s, want %s running", i, c.ID, c.State, ids[i])
		}
	}
	latest, err := st.Latest(ws)
	if err != nil || latest.ID != ids[2] {
		t.Errorf("latest: %v, %v", latest, err)
	}
	if _, err := st.Get(ids[0][:4]); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("short prefix: %v", err)
	}
	if c, err := st.Get(ids[1]); err != nil || c.ID != ids[1] {
		t.Errorf("full id: %v", err)
	}
	if c, err := st.Get(ids[1][:len(ids[1])-1]); err != nil && !errors.Is(err, ErrAmbiguous) || err == nil && c.ID != ids[1] {
		t.Errorf("long prefix: %v", err)
	}
	if _, err := st.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	c, _ := st.Get(ids[2])
	if err := c.Discard(false); !errors.Is(err, ErrRunning) {
		t.Errorf("discard running: %v", err)
	}
	if err := c.Discard(true); err != nil {
		t.Fatal(err)
	}
	if list, _ := st.List(); len(list) != 2 {
		t.Errorf("after discard: %d", len(list))
	}
	if _, err := st.Create(ws, "p", ModeOverlay, []Mount{{Name: "../x", Source: ws}}); err == nil {
		t.Errorf("a mount name with a slash was accepted")
	}
}

func TestManifestRoundTrip(t *testing.T) {
	src := original(t)
	m, err := scanManifest(src)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "m")
	if err := writeManifest(file, m); err != nil {
		t.Fatal(err)
	}
	back, err := readManifest(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(back) != len(m) || len(m) != 19 {
		t.Fatalf("%d entries back of %d (want 19)", len(back), len(m))
	}
	for i := range m {
		if m[i] != back[i] {
			t.Errorf("entry %d: %+v != %+v", i, m[i], back[i])
		}
	}
	if e, ok := m.find("link"); !ok || e.Type != TypeSymlink || e.Target != "keep.txt" {
		t.Errorf("link: %+v", e)
	}
	if got := len(m.under("dir")); got != 3 {
		t.Errorf("under dir: %d", got)
	}
}

func TestTwoMounts(t *testing.T) {
	ws, repo := t.TempDir(), t.TempDir()
	write(t, ws, "a.txt", "a\n", 0o644)
	write(t, repo, "x/y.txt", "y\n", 0o644)
	c, err := newStore(t).Create(ws, "p", ModeOverlay, []Mount{
		{Name: WorkspaceMount, Source: ws, Target: "/workspace"},
		{Name: "mount-0", Source: repo, Target: "/repo2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	write(t, c.UpperDir(WorkspaceMount), "a.txt", "A\n", 0o644)
	write(t, c.UpperDir("mount-0"), "x/y.txt", "Y\n", 0o644)
	write(t, c.UpperDir("mount-0"), "x/new.txt", "new\n", 0o644)
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	cs, _ := c.Changes()
	if len(cs) != 3 || cs[0].Mount != WorkspaceMount || cs[1].Mount != "mount-0" {
		t.Fatalf("changes: %+v", cs)
	}
	for arg, want := range map[string]Ref{
		"/repo2/x":                 {"mount-0", "x"},
		"mount-0:x/y.txt":          {"mount-0", "x/y.txt"},
		repo + "/x/new.txt":        {"mount-0", "x/new.txt"},
		"/workspace/a.txt":         {WorkspaceMount, "a.txt"},
		"workspace:":               {WorkspaceMount, ""},
		"a.txt":                    {WorkspaceMount, "a.txt"},
		"x/y.txt":                  {"mount-0", "x/y.txt"}, // relative to a cwd in repo
		filepath.Join(ws, "a.txt"): {WorkspaceMount, "a.txt"},
	} {
		cwd := "/nowhere"
		if arg == "x/y.txt" {
			cwd = repo
		}
		got, err := c.Resolve(arg, cwd)
		if err != nil || got != want {
			t.Errorf("Resolve(%q) = %v, %v; want %v", arg, got, err, want)
		}
	}
	if _, err := c.Resolve("/etc/passwd", "/"); err == nil {
		t.Error("a path outside every mount resolved")
	}
	if _, err := c.Resolve("../x", "/nowhere"); err == nil {
		t.Error("../x resolved")
	}
	fds, err := c.Diff(Select(cs, []Ref{{"mount-0", "x"}}))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	WriteUnified(&buf, fds)
	if !strings.Contains(buf.String(), "diff --git a/repo2/x/y.txt b/repo2/x/y.txt\n") || strings.Contains(buf.String(), "a.txt") {
		t.Errorf("diff of mount-0:\n%s", buf.String())
	}
	if fds[0].Display != "/repo2/x/new.txt" {
		t.Errorf("display %q", fds[0].Display)
	}
	res, err := c.Apply(cs, ApplyOptions{})
	if err != nil || !res.Removed {
		t.Fatalf("apply: %v %+v", err, res)
	}
	if data, _ := os.ReadFile(filepath.Join(repo, "x/y.txt")); string(data) != "Y\n" {
		t.Errorf("repo not applied: %q", data)
	}
}

// TestDeletedDirGainedFiles: a directory the changeset deletes, where the
// user has added a file since, is not deleted (the file would be lost).
func TestDeletedDirGainedFiles(t *testing.T) {
	c, src := sealed(t)
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	write(t, src, "dir/sub/users-new-file", "mine\n", 0o644)
	cs, _ := c.Changes()
	res, err := c.Apply(cs, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, cf := range res.Conflicts {
		got = append(got, cf.Path+": "+cf.Reason)
	}
	if want := "dir: the directory holds files the changeset does not delete\ndir/sub: the directory holds files the changeset does not delete"; strings.Join(got, "\n") != want {
		t.Errorf("conflicts:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
	if _, err := os.Stat(filepath.Join(src, "dir/sub/users-new-file")); err != nil {
		t.Errorf("the user's file is gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(src, "dir/a")); err == nil {
		t.Errorf("dir/a was not deleted")
	}
}

// TestUnifiedGitApply: git apply turns a copy of the original into the
// result with the workspace's unified diff (text files, modes, symlinks,
// new directories with files).
func TestUnifiedGitApply(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	src := t.TempDir()
	write(t, src, "mod.txt", "1\n2\n3\n4\n5\n6\n7\n8\n9\n", 0o644)
	write(t, src, "del.txt", "bye\n", 0o644)
	write(t, src, "run.sh", "echo\n", 0o644)
	write(t, src, "old/x", "x\n", 0o644)
	symlink(t, src, "link", "mod.txt")
	c, err := newStore(t).Create(src, "p", ModeCopy, []Mount{{Name: WorkspaceMount, Source: src, Target: "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	tree := c.TreeDir(WorkspaceMount)
	os.Remove(tree)
	if out, err := exec.Command("cp", "-a", src, tree).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	write(t, tree, "mod.txt", "1\n2\nthree\n4\n5\n6\n7\n8\n9\nten\n", 0o644)
	os.Remove(filepath.Join(tree, "del.txt"))
	os.Chmod(filepath.Join(tree, "run.sh"), 0o755)
	os.RemoveAll(filepath.Join(tree, "old"))
	write(t, tree, "new/dir/f.txt", "new\n", 0o644)
	os.Remove(filepath.Join(tree, "link"))
	symlink(t, tree, "link", "run.sh")
	symlink(t, tree, "newlink", "new/dir")
	write(t, tree, "tab\there \"q\".txt", "tab\n", 0o644)
	write(t, tree, "caf\u00e9.txt", "caf\u00e9\n", 0o644)
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	cs, _ := c.Changes()
	fds, err := c.Diff(cs)
	if err != nil {
		t.Fatal(err)
	}
	var patch bytes.Buffer
	WriteUnified(&patch, fds)
	copyDir := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", src, copyDir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	text := patch.String()
	cmd := exec.Command("git", "apply", "-")
	cmd.Dir, cmd.Stdin = copyDir, &patch
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git apply: %v: %s\n%s", err, out, text)
	}
	if !strings.Contains(text, "diff --git \"a/caf\\303\\251.txt\" \"b/caf\\303\\251.txt\"\n") ||
		!strings.Contains(text, "+++ \"b/tab\\there \\\"q\\\".txt\"\t\n") {
		t.Errorf("names are not quoted as git does:\n%s", text)
	}
	os.Remove(filepath.Join(copyDir, "old")) // git leaves empty directories
	if d := diffSnapshots(snapshot(t, tree), snapshot(t, copyDir)); d != "" {
		t.Errorf("git apply of the diff differs from the result:\n%s", d)
	}
}

// TestApplyRefusesSymlinkedParent: a path whose parent is a symbolic link
// in the original (to outside the workspace) is not written through it.
func TestApplyRefusesSymlinkedParent(t *testing.T) {
	src, outside := t.TempDir(), t.TempDir()
	write(t, src, "d/f", "f\n", 0o644)
	c, err := newStore(t).Create(src, "p", ModeOverlay, []Mount{{Name: WorkspaceMount, Source: src, Target: "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	write(t, c.UpperDir(WorkspaceMount), "d/f", "changed\n", 0o644)
	write(t, c.UpperDir(WorkspaceMount), "d/new", "new\n", 0o4755)
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	// After the run, d becomes a link to another directory.
	os.RemoveAll(filepath.Join(src, "d"))
	symlink(t, src, "d", outside)
	cs, _ := c.Changes()
	res, err := c.Apply(cs, ApplyOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 2 || !strings.Contains(res.Conflicts[0].Reason, "symbolic link") {
		t.Errorf("conflicts: %+v", res.Conflicts)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("apply wrote through the link: %v", entries)
	}
	// Once d is a directory again, d/new applies, without its setuid bit.
	os.Remove(filepath.Join(src, "d"))
	mkdir(t, src, "d")
	cs, _ = c.Changes()
	if _, err := c.Apply(Select(cs, []Ref{{WorkspaceMount, "d/new"}}), ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(src, "d/new"))
	if err != nil || fi.Mode() != 0o755 {
		t.Errorf("d/new: %v, %v (want -rwxr-xr-x: no setuid)", fi.Mode(), err)
	}
	// and counts as applied on a second run.
	cs, _ = c.Changes()
	if len(Select(cs, []Ref{{WorkspaceMount, "d/new"}})) != 0 {
		t.Errorf("d/new is still listed")
	}
}

func TestApplyLock(t *testing.T) {
	c, _ := sealed(t)
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	unlock, err := c.lock()
	if err != nil {
		t.Fatal(err)
	}
	cs, _ := c.Changes()
	if _, err := c.Apply(cs, ApplyOptions{}); !errors.Is(err, ErrBusy) {
		t.Errorf("apply while locked: %v", err)
	}
	if err := c.Discard(false); !errors.Is(err, ErrBusy) {
		t.Errorf("discard while locked: %v", err)
	}
	unlock()
	if err := c.Discard(false); err != nil {
		t.Fatal(err)
	}
}

// A mount added to a running changeset records its base then, and seals
// with the others; one dropped leaves nothing of it.
func TestAddAndDropMount(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, d := range []string{a, b} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "f"), []byte("x\n"), 0o644)
	}
	c, err := newStore(t).Create("/ws", "p.yaml", ModeCopy, []Mount{{Name: "request-a", Source: a, Target: "/t/a"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddMount(Mount{Name: "request-b", Source: b, Target: "/t/b"}); err != nil {
		t.Fatal(err)
	}
	if err := c.AddMount(Mount{Name: "request-b", Source: b}); err == nil {
		t.Error("a mount added twice")
	}
	if err := c.DropMount("request-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(c.Dir(), "request-a")); !os.IsNotExist(err) {
		t.Errorf("the dropped mount's directory: %v", err)
	}
	os.WriteFile(filepath.Join(c.TreeDir("request-b"), "f"), []byte("y\n"), 0o644)
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	changes, err := c.Changes()
	if err != nil || len(changes) != 1 || changes[0].Mount != "request-b" || changes[0].Kind != KindModified {
		t.Fatalf("changes %+v, %v: want f modified in request-b", changes, err)
	}
}
