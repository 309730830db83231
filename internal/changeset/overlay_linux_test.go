package changeset

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mountOverlay mounts a real overlay of lower with the changeset's upper
// and work directories, as the engine does; it skips when this process
// cannot (not root, no overlayfs).
func mountOverlay(t *testing.T, lower, upper, work string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a real overlay mount needs root")
	}
	merged := t.TempDir()
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("cannot mount an overlay here (%s): %v", opts, err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	return merged
}

func sh(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// TestRealOverlay makes every kind of change through a real overlay mount,
// then checks that the lower stayed byte-identical, and that Seal and
// Apply reproduce the merged tree exactly in the original.
func TestRealOverlay(t *testing.T) {
	src := original(t)
	write(t, src, "tree/a/b/c.txt", "c\n", 0o644)
	write(t, src, "tree/a/d.txt", "d\n", 0o644)
	write(t, src, "big.txt", strings.Repeat("line\n", 5000), 0o644)
	c, err := newStore(t).Create(src, "test", ModeOverlay, []Mount{{Name: WorkspaceMount, Source: src, Target: "/workspace"}})
	if err != nil {
		t.Fatal(err)
	}
	merged := mountOverlay(t, src, c.UpperDir(WorkspaceMount), c.WorkDir(WorkspaceMount))
	before := snapshot(t, src)
	applyEdits(t, merged)
	sh(t, merged, `
		mv keep.txt renamed.txt          # rename a file
		mv tree moved                    # rename a directory (copy + delete without redirect_dir)
		ln -s moved/a/d.txt rel-link
		chmod 0600 moved/a/d.txt
		touch touched.txt                # copied up? no: only mtime; must not show
		chmod 0644 touched.txt
		sed -i 's/^line$/LINE/;1000s/.*/x/' big.txt
		mkdir -p opq2/k && echo k > opq2/k/f
		rm -rf opq2 && mkdir opq2 && echo back > opq2/f   # opaque directory
		printf 'tab\there\n' > 'name with spaces.txt'
	`)
	want := snapshot(t, merged)
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatalf("unmounting: %v", err)
	}
	if d := diffSnapshots(before, snapshot(t, src)); d != "" {
		t.Fatalf("the lower changed through the overlay:\n%s", d)
	}
	if err := c.Seal(); err != nil {
		t.Fatal(err)
	}
	cs, err := c.Changes()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range cs {
		if ch.BaseChanged {
			t.Errorf("%s: base changed", ch.Path)
		}
		if ch.Path == "touched.txt" {
			t.Errorf("touched.txt shows as %s", ch.Kind)
		}
	}
	fds, err := c.Diff(cs)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	WriteStat(&buf, fds, 80)
	t.Logf("diff --stat:\n%s", buf.String())
	res, err := c.Apply(cs, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) > 0 || !res.Removed {
		t.Errorf("apply: conflicts %v, removed %v", res.Conflicts, res.Removed)
	}
	got := snapshot(t, src)
	if d := diffSnapshots(want, got); d != "" {
		t.Errorf("after apply, the original differs from what the overlay showed:\n%s", d)
	}
	for p := range got {
		if strings.Contains(p, ".propio-") {
			t.Errorf("a temporary file was left: %s", p)
		}
	}
	if _, err := os.Stat(filepath.Join(src, "del.txt")); err == nil {
		t.Error("a whiteout leaked")
	}
}
