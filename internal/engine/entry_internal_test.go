package engine

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
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
	names, hdrs := tarEntries(t, &buf)
	if h := hdrs["data/a"]; h == nil || h.Mode&0o6000 != 0 {
		t.Errorf("data/a: %+v; want it without setuid", h)
	}
	if h := hdrs["data/link"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/passwd" {
		t.Errorf("data/link: %+v", h)
	}
	if names != "data data/ data/a data/link data/sub/" {
		t.Errorf("entries %q", names)
	}

	_, err = writeEntryTar(io.Discard, backend.Entry{Name: "data", From: dir, Max: 4})
	if !errors.Is(err, backend.ErrEntryTooLarge) {
		t.Errorf("over its max: %v", err)
	}
	buf.Reset()
	if _, err := writeEntryTar(&buf, backend.Entry{Name: "one", From: filepath.Join(dir, "a")}); err != nil {
		t.Fatal(err)
	}
	if names, _ := tarEntries(t, &buf); names != "one one" {
		t.Errorf("a file's entries %q, want the empty one and the file", names)
	}
}

// A file is copied to its end, not by its stat size: the kernel's files say
// 0 bytes and hold more (the launcher refuses them as sources; the copy
// does not rely on that).
func TestWriteEntryTarReadsToTheEnd(t *testing.T) {
	cmdline := "/proc/" + strconv.Itoa(os.Getpid()) + "/cmdline" // /proc/self is a link
	want, err := os.ReadFile(cmdline)
	if err != nil || len(want) == 0 {
		t.Skipf("no %s to read: %v", cmdline, err)
	}
	if st, err := os.Stat(cmdline); err != nil || st.Size() != 0 {
		t.Skipf("%s says %v bytes (%v): not a file whose stat lies", cmdline, st.Size(), err)
	}
	var buf bytes.Buffer
	c, err := writeEntryTar(&buf, backend.Entry{Name: "cmdline", From: cmdline})
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	tr.Next() // the empty file that takes the place of the last copy
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(tr)
	if h.Size == 0 || len(got) != int(h.Size) || c.Bytes != h.Size || !bytes.Equal(want, got) {
		t.Errorf("copied %d bytes (%q, counted %d) of %s %q", h.Size, got, c.Bytes, cmdline, want)
	}
}

// A file larger than smallFile is taken at its stat size, and its copy fails
// when it holds more or less than that: it is never cut short unsaid.
func TestFileBody(t *testing.T) {
	big := bytes.Repeat([]byte("x"), smallFile+10)
	for name, tc := range map[string]struct {
		data     []byte
		stat     int64
		wantSize int64
		wantErr  bool
	}{
		"small, stat says 0":     {[]byte("abc"), 0, 3, false},
		"small, stat says more":  {[]byte("abc"), 10, 3, false},
		"large, as stat says":    {big, int64(len(big)), int64(len(big)), false},
		"large, stat says less":  {big, 5, 0, true},
		"large, stat says 1 MiB": {big, smallFile, 0, true},
	} {
		t.Run(name, func(t *testing.T) {
			body, size, err := fileBody(bytes.NewReader(tc.data), tc.stat)
			if (err != nil) != tc.wantErr || size != tc.wantSize {
				t.Fatalf("fileBody = %d, %v; want %d, error %v", size, err, tc.wantSize, tc.wantErr)
			}
			if err == nil {
				got, _ := io.ReadAll(body)
				if !bytes.Equal(got, tc.data) {
					t.Errorf("body is %d bytes, want %d", len(got), len(tc.data))
				}
			}
		})
	}
}

// The copy never follows a link: not one in the path it was given (the
// source changed since it was judged), nor one below it, a directory's
// among them, which is copied as a link.
func TestWriteEntryTarFollowsNoLink(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "tree", "sub"), 0o755)
	os.MkdirAll(filepath.Join(dir, "elsewhere"), 0o755)
	os.WriteFile(filepath.Join(dir, "elsewhere", "secret"), []byte("host only"), 0o644)
	os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(dir, "tree", "sub", "dirlink"))
	os.Symlink(filepath.Join(dir, "tree"), filepath.Join(dir, "treelink"))
	os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(dir, "tree", "swapped"))

	for _, from := range []string{filepath.Join(dir, "treelink"), filepath.Join(dir, "treelink", "sub"), filepath.Join(dir, "tree", "swapped")} {
		if _, err := writeEntryTar(io.Discard, backend.Entry{Name: "x", From: from}); !errors.Is(err, syscall.ELOOP) {
			t.Errorf("archiving %s, a path through a link: %v; want ELOOP", from, err)
		}
	}
	var buf bytes.Buffer
	if _, err := writeEntryTar(&buf, backend.Entry{Name: "t", From: filepath.Join(dir, "tree")}); err != nil {
		t.Fatal(err)
	}
	names, hdrs := tarEntries(t, &buf)
	if h := hdrs["t/sub/dirlink"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != filepath.Join(dir, "elsewhere") {
		t.Errorf("t/sub/dirlink: %+v", h)
	}
	if names != "t t/ t/sub/ t/sub/dirlink t/swapped" {
		t.Errorf("entries %q", names)
	}
}

// tarEntries reads a tar stream: its entries' names in order, separated by
// spaces, and their headers by name.
func tarEntries(t *testing.T, r io.Reader) (string, map[string]*tar.Header) {
	t.Helper()
	var names []string
	hdrs := map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return strings.Join(names, " "), hdrs
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		hdrs[h.Name] = h
	}
}
