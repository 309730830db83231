package fsutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWriteFileIfChanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "resolv.conf")
	if err := WriteFileIfChanged(path, []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(path, old, old)
	// The same content: not written again.
	if err := WriteFileIfChanged(path, []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); !st.ModTime().Equal(old) {
		t.Errorf("the file was rewritten though its content was the same")
	}
	if err := WriteFileIfChanged(path, []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two\n" {
		t.Errorf("content %q, want two", b)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v", st.Mode())
	}
}

func TestWithin(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dir, path string
		rel       string
		want      bool
	}{
		{"/home/me", "/home/me/.local/state/propio-sandbox/changesets", ".local/state/propio-sandbox/changesets", true},
		{"/home/me", "/home/me", ".", true},
		{"/home/me", "/home/me2", "", false},
		{"/home/me", "/home", "", false},
		{"/home/me", "/home/me/..x", "..x", true},
	} {
		rel, ok := Rel(c.dir, c.path)
		if ok != c.want || rel != c.rel || Within(c.dir, c.path) != c.want {
			t.Errorf("Rel(%q, %q) = %q, %v; want %q, %v", c.dir, c.path, rel, ok, c.rel, c.want)
		}
	}
}

// WriteNew makes a new file, mode 0600, and never writes through what is
// there already: a file, or a link (to a file of the host, say).
func TestWriteNew(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "new")
	if err := WriteNew(path, strings.NewReader("content")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "content" {
		t.Fatalf("read %q, %v", b, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v; want 0600", fi.Mode().Perm())
	}
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("host"), 0o644)
	link := filepath.Join(dir, "link")
	os.Symlink(target, link)
	for _, p := range []string{path, link} {
		if err := WriteNew(p, strings.NewReader("x")); err == nil {
			t.Errorf("WriteNew(%s) wrote over what was there", p)
		}
	}
	if b, _ := os.ReadFile(target); string(b) != "host" {
		t.Errorf("the link's target was written: %q", b)
	}
}
