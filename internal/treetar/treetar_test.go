package treetar

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// Extract refuses entries that would land outside its directory: a
// name with .., a file written through a symbolic link the archive made,
// a hard link to outside.
func TestExtractStaysInside(t *testing.T) {
	t.Parallel()
	for name, entries := range map[string][]*tar.Header{
		"dot dot":           {{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"through a symlink": {{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, {Name: "link/escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"hard link outside": {{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}},
		"under a file":      {{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644}, {Name: "f/g", Typeflag: tar.TypeReg, Mode: 0o644}},
		"dir after symlink": {{Name: "d", Typeflag: tar.TypeSymlink, Linkname: "."}, {Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range entries {
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
			}
			tw.Close()
			outside := t.TempDir()
			dir := filepath.Join(outside, "a", "tree")
			if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := Extract(&buf, dir); err == nil {
				t.Fatalf("extracted %v", entries)
			}
			if _, err := os.Lstat(filepath.Join(outside, "a", "escape")); err == nil {
				t.Fatal("an entry landed outside the tree")
			}
		})
	}
}
