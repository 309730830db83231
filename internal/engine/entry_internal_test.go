package engine

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/propio/propio-sandbox/internal/backend"
)

// The entry's stream starts with an empty file of its name (which replaces
// the last copy), then the tree under that name: links as links, setuid
// dropped, sockets and fifos and skipped paths left out.
func TestWriteEntryTar(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub", "skipped"), 0o755)
	os.WriteFile(filepath.Join(dir, "a"), []byte("12345"), 0o4755)
	os.Chmod(filepath.Join(dir, "a"), 0o4755)
	os.WriteFile(filepath.Join(dir, "sub", "skipped", "x"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, ".env"), []byte("SECRET"), 0o600)
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600)

	var buf bytes.Buffer
	c, err := writeEntryTar(&buf, backend.Entry{Name: "data", From: dir, Skip: map[string]bool{"sub/skipped": true, ".env": true}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Bytes != 5 || c.Files != 2 {
		t.Errorf("copied %+v: want 5 bytes, 2 files (a, link)", c)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "data/a" && h.Mode&0o6000 != 0 {
			t.Errorf("data/a keeps mode %o", h.Mode)
		}
		if h.Name == "data/link" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/passwd") {
			t.Errorf("data/link: %+v", h)
		}
	}
	if got := strings.Join(names, " "); got != "data data/ data/a data/link data/sub/" {
		t.Errorf("entries %q", got)
	}

	_, err = writeEntryTar(io.Discard, backend.Entry{Name: "data", From: dir, Max: 4})
	if !errors.Is(err, backend.ErrEntryTooLarge) {
		t.Errorf("over its max: %v", err)
	}
	buf.Reset()
	if _, err := writeEntryTar(&buf, backend.Entry{Name: "one", From: filepath.Join(dir, "a")}); err != nil {
		t.Fatal(err)
	}
	tr = tar.NewReader(&buf)
	for _, want := range []string{"one", "one"} {
		if h, err := tr.Next(); err != nil || h.Name != want {
			t.Fatalf("a file's entry: %v, %v; want %s", h, err, want)
		}
	}
}
