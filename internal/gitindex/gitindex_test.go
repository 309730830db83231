package gitindex

import (
	"bytes"
	"crypto/sha1"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// git runs the host's git in a repository the test made, isolated from the
// user's and the system's configuration.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir,
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func needGit(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git on this host to write index files with")
	}
}

// repo makes a repository in a new directory with files whose paths share
// long prefixes (what version 4 compresses), a space, non-ASCII, a
// symbolic link and a deep path; format is sha1 or sha256.
func repo(t *testing.T, format string) string {
	t.Helper()
	dir := t.TempDir()
	git(t, dir, "init", "-q", "--object-format="+format)
	files := []string{
		".env", "README", "a/b/c/deep.txt", "src/main.go", "src/main_test.go",
		"src/util/strings.go", "src/util/strings_test.go", "with space.txt", "ünïcode.txt",
		strings.Repeat("long/", 30) + "name.txt",
	}
	for _, f := range files {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("README", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "add", "-A")
	return dir
}

// lsFiles is what git says the index lists.
func lsFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, p := range strings.Split(git(t, dir, "ls-files", "-z"), "\x00") {
		if p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func TestTrackedVersions(t *testing.T) {
	t.Parallel()
	needGit(t)
	for _, tc := range []struct {
		name, format, version string
		prepare               func(t *testing.T, dir string)
	}{
		{name: "v2", format: "sha1", version: "2"},
		{name: "v3", format: "sha1", version: "3", prepare: func(t *testing.T, dir string) {
			// Extended flags: an intent-to-add path and a skip-worktree one.
			os.WriteFile(filepath.Join(dir, "later.txt"), []byte("x"), 0o644)
			git(t, dir, "add", "-N", "later.txt")
			git(t, dir, "update-index", "--skip-worktree", "README")
		}},
		{name: "v4", format: "sha1", version: "4"},
		{name: "v4-ext", format: "sha1", version: "4", prepare: func(t *testing.T, dir string) {
			git(t, dir, "update-index", "--skip-worktree", "src/main.go")
		}},
		{name: "sha256-v2", format: "sha256", version: "2"},
		{name: "sha256-v3", format: "sha256", version: "3", prepare: func(t *testing.T, dir string) {
			git(t, dir, "update-index", "--skip-worktree", "README")
		}},
		{name: "sha256-v4", format: "sha256", version: "4"},
		{name: "conflict", format: "sha1", version: "2", prepare: func(t *testing.T, dir string) {
			// Three stages of one path: listed once.
			oid := strings.TrimSpace(git(t, dir, "hash-object", "-w", "README"))
			info := ""
			for stage := 1; stage <= 3; stage++ {
				info += "100644 " + oid + " " + string(rune('0'+stage)) + "\tconflicted.txt\n"
			}
			cmd := exec.Command("git", "update-index", "--index-info")
			cmd.Dir, cmd.Stdin = dir, strings.NewReader(info)
			cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := repo(t, tc.format)
			if tc.prepare != nil {
				tc.prepare(t, dir)
			}
			git(t, dir, "update-index", "--index-version", tc.version)
			data, err := os.ReadFile(filepath.Join(dir, ".git", "index"))
			if err != nil {
				t.Fatal(err)
			}
			if got := data[7]; got != tc.version[0]-'0' {
				t.Fatalf("git wrote index version %d, want %s", got, tc.version)
			}
			got, err := Tracked(dir)
			if err != nil {
				t.Fatal(err)
			}
			want := lsFiles(t, dir)
			if !slices.Equal(got, want) {
				t.Errorf("Tracked:\n got %q\nwant %q", got, want)
			}
			if !slices.Contains(got, ".env") || !slices.Contains(got, "with space.txt") || !slices.Contains(got, "ünïcode.txt") {
				t.Errorf("paths missing: %q", got)
			}
		})
	}
}

// A linked worktree's .git is a gitfile; its object format is in the main
// repository's config (commondir).
func TestTrackedWorktree(t *testing.T) {
	t.Parallel()
	needGit(t)
	for _, format := range []string{"sha1", "sha256"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			dir := repo(t, format)
			git(t, dir, "commit", "-q", "-m", "init")
			wt := filepath.Join(t.TempDir(), "wt")
			git(t, dir, "worktree", "add", "-q", wt)
			if fi, err := os.Lstat(filepath.Join(wt, ".git")); err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("the worktree's .git is not a gitfile: %v %v", fi, err)
			}
			got, err := Tracked(wt)
			if err != nil {
				t.Fatal(err)
			}
			if want := lsFiles(t, wt); !slices.Equal(got, want) {
				t.Errorf("Tracked:\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestTrackedUnsupported(t *testing.T) {
	t.Parallel()
	needGit(t)
	t.Run("split", func(t *testing.T) {
		t.Parallel()
		dir := repo(t, "sha1")
		git(t, dir, "update-index", "--split-index")
		_, err := Tracked(dir)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "split index") {
			t.Fatalf("want a split index refused, got %v", err)
		}
	})
	t.Run("sparse", func(t *testing.T) {
		t.Parallel()
		dir := repo(t, "sha1")
		git(t, dir, "commit", "-q", "-m", "init")
		git(t, dir, "sparse-checkout", "init", "--cone", "--sparse-index")
		git(t, dir, "sparse-checkout", "set", "src")
		_, err := Tracked(dir)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "sparse index") {
			t.Fatalf("want a sparse index refused, got %v", err)
		}
	})
}

func TestTrackedNoRepository(t *testing.T) {
	t.Parallel()
	if _, err := Tracked(t.TempDir()); !errors.Is(err, ErrNoRepository) {
		t.Fatalf("want ErrNoRepository, got %v", err)
	}
	// A repository without an index yet lists nothing, as an error saying so.
	needGit(t)
	dir := t.TempDir()
	git(t, dir, "init", "-q")
	if _, err := Tracked(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("want not-exist for a missing index, got %v", err)
	}
}

// A FIFO (or any file but a regular one) where the index or the gitfile
// should be is refused at once, not waited on.
func TestTrackedNonRegular(t *testing.T) {
	t.Parallel()
	for _, where := range []string{".git/index", ".git/config", ".git"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, ".git"), 0o755); err != nil {
				t.Fatal(err)
			}
			if where == ".git" {
				os.Remove(filepath.Join(dir, ".git"))
			}
			if err := syscall.Mkfifo(filepath.Join(dir, where), 0o644); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			done := make(chan error, 1)
			go func() { _, err := Tracked(dir); done <- err }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "FIFO") {
					t.Fatalf("want a FIFO refused, got %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Tracked blocked on a FIFO")
			}
		})
	}
}

func TestParseDamaged(t *testing.T) {
	t.Parallel()
	needGit(t)
	dir := repo(t, "sha1")
	good, err := os.ReadFile(filepath.Join(dir, ".git", "index"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := Parse(good, sha1.Size)
	if err != nil {
		t.Fatal(err)
	}
	// index.skipHash writes zeros for the checksum: accepted.
	skip := bytes.Clone(good)
	clear(skip[len(skip)-sha1.Size:])
	if got, err := Parse(skip, sha1.Size); err != nil || !slices.Equal(got, want) {
		t.Errorf("a zero checksum: %q, %v", got, err)
	}
	for name, data := range map[string][]byte{
		"flipped byte":  func() []byte { b := bytes.Clone(good); b[40] ^= 1; return b }(),
		"truncated":     good[:len(good)/2],
		"not an index":  []byte("PACK0000000000000000000000000000000000"),
		"version 5":     func() []byte { b := bytes.Clone(skip); b[7] = 5; return b }(),
		"sha256 size":   good, // read as SHA-256: the checksum cannot match
		"cut, no check": func() []byte { b := bytes.Clone(skip[:60]); return append(b, make([]byte, 20)...) }(),
	} {
		size := sha1.Size
		if name == "sha256 size" {
			size = 32
		}
		if got, err := Parse(data, size); err == nil {
			t.Errorf("%s: want an error, got %q", name, got)
		}
	}
}

func TestVarint(t *testing.T) {
	t.Parallel()
	// Values from git's varint.c encoding.
	for _, tc := range []struct {
		in   []byte
		want uint64
		n    int
	}{
		{[]byte{0x00}, 0, 1},
		{[]byte{0x7f}, 127, 1},
		{[]byte{0x80, 0x00}, 128, 2},
		{[]byte{0x80, 0x01}, 129, 2},
		{[]byte{0xff, 0x7f}, 16511, 2},
		{[]byte{0x80, 0x80, 0x00}, 16512, 3},
		{[]byte{0x80}, 0, 0},
	} {
		if v, n := varint(tc.in); v != tc.want || n != tc.n {
			t.Errorf("varint(%x) = %d, %d; want %d, %d", tc.in, v, n, tc.want, tc.n)
		}
	}
}
