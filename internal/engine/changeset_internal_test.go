package engine

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestCopyRoundTrip copies a tree into a volume and back out through the
// engine's archive API: contents, modes (setgid and read-only directories
// too), mtimes, symbolic links (dangling and absolute ones too), empty
// directories and owners come back the same, and the helper containers and
// the volume are gone afterwards.
func TestCopyRoundTrip(t *testing.T) {
	testenv.RequireEngine(t)
	ctx := context.Background()
	eng, err := Connect(ctx, HostFromEnv(), Streams{Out: os.Stdout, Err: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()

	src := t.TempDir()
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	for name, content := range map[string]string{"a.txt": "alpha\n", "dir/b.bin": "\x00\x01binary", "dir/sub/c": "", "x,y:z": "odd name"} {
		p := filepath.Join(src, name)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(content), 0o640))
		must(t, os.Chtimes(p, mtime, mtime))
	}
	must(t, os.Chmod(filepath.Join(src, "a.txt"), 0o755))
	must(t, os.Mkdir(filepath.Join(src, "empty"), 0o2775))
	must(t, os.Symlink("a.txt", filepath.Join(src, "link")))
	must(t, os.Symlink("/nowhere/at/all", filepath.Join(src, "dangling")))
	must(t, os.Mkdir(filepath.Join(src, "ro"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "ro", "f"), []byte("f"), 0o444))
	must(t, os.Chmod(filepath.Join(src, "ro"), 0o555))
	t.Cleanup(func() { os.Chmod(filepath.Join(src, "ro"), 0o755) })
	// The root's mode and owner come along too (the engine skips an
	// archive's "." entry).
	must(t, os.Chmod(src, 0o750))
	if os.Geteuid() == 0 {
		filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				os.Lchown(p, 65534, 65534)
			}
			return err
		})
	}

	name := "propio-test-copy-" + fmt.Sprint(time.Now().UnixNano())
	labels := map[string]string{LabelProject: name}
	if _, err := eng.cli.Client().VolumeCreate(ctx, client.VolumeCreateOptions{Name: name, Labels: labels}); err != nil {
		t.Fatal(err)
	}
	defer eng.Remove(ctx, name, 0)
	if err := eng.CopyIn(ctx, backend.Volume{Name: name, Image: testenv.ProbeImage, Labels: labels}, src); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "tree")
	must(t, os.Mkdir(out, 0o700))
	if err := eng.CopyOut(ctx, backend.Volume{Name: name, Image: testenv.ProbeImage, Labels: labels}, out); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(out, "ro"), 0o755) })
	want, got := treeOf(t, src), treeOf(t, out)
	if !slices.Equal(want, got) {
		t.Errorf("the tree came back different:\nwant:\n%s\ngot:\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
	}
	if err := eng.Remove(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
	for _, kind := range [][]string{{"ps", "-aq"}, {"volume", "ls", "-q"}} {
		if left, _ := testenv.Docker(append(kind, "--filter", "label="+LabelProject+"="+name)...); strings.TrimSpace(left) != "" {
			t.Errorf("left behind: %v %s", kind, left)
		}
	}
}

// treeOf describes every entry under root, the root's mode included: type
// and mode, owner, size, mtime to the second, content hash, link target.
func treeOf(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d", rel, fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %d %d %x", fi.Size(), fi.ModTime().Unix(), sha256.Sum256(b))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestKernelAtLeast(t *testing.T) {
	t.Parallel()
	for release, want := range map[string]bool{"6.18.44-fc-v657": true, "5.11.0": true, "5.10.0-21-amd64": false, "4.19.0": false, "6.1": true, "weird": false} {
		if got := kernelAtLeast(release, 5, 11); got != want {
			t.Errorf("kernelAtLeast(%q, 5, 11) = %v, want %v", release, got, want)
		}
	}
}
