package profile_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/profile"
)

// TestNonRegularFiles: a profile file, or an extends target, that is not a
// regular file (a FIFO an agent made, a device, a directory), a symbolic
// link loop, or unreadable is refused at once, naming the file; an extends
// target at the extends line.
func TestNonRegularFiles(t *testing.T) {
	tests := map[string]struct {
		make func(t *testing.T, path string) // makes the odd file at path
		root bool                            // skip as root (root reads anything)
		want string                          // what the error says about the file
	}{
		"FIFO": {make: func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}, want: "is a FIFO (named pipe), not a regular file"},
		"device": {make: func(t *testing.T, path string) {
			if err := os.Symlink("/dev/zero", path); err != nil {
				t.Fatal(err)
			}
		}, want: "is a character device, not a regular file"},
		"directory": {make: func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}, want: "is a directory, not a regular file"},
		"symbolic link loop": {make: func(t *testing.T, path string) {
			if err := os.Symlink(filepath.Base(path), path); err != nil {
				t.Fatal(err)
			}
		}, want: "is a symbolic link loop"},
		"unreadable": {make: func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("image: a\n"), 0o000); err != nil {
				t.Fatal(err)
			}
		}, root: true, want: "cannot be read: permission denied"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if tt.root && os.Geteuid() == 0 {
				t.Skip("root reads a file of mode 0000")
			}
			t.Run("profile", func(t *testing.T) {
				ws := t.TempDir()
				if err := os.Mkdir(filepath.Join(ws, ".propio"), 0o755); err != nil {
					t.Fatal(err)
				}
				tt.make(t, filepath.Join(ws, profile.RepoProfile))
				err := loadBounded(t, profile.Locations{Workspace: ws}, "")
				want := "profile file " + profile.RepoProfile + " " + tt.want
				if err == nil || !strings.HasPrefix(err.Error(), want) {
					t.Fatalf("got %v, want an error starting %q", err, want)
				}
				var re *profile.ReadError
				if !errors.As(err, &re) {
					t.Errorf("%v is not a *profile.ReadError", err)
				}
			})
			t.Run("extends", func(t *testing.T) {
				dir := t.TempDir()
				writeFiles(t, dir, map[string]string{"child.yaml": "# a child\nimage: a\nextends: ./parent.yaml\n"})
				tt.make(t, filepath.Join(dir, "parent.yaml"))
				child := filepath.Join(dir, "child.yaml")
				err := loadBounded(t, profile.Locations{Workspace: dir}, child)
				var list profile.List
				if !errors.As(err, &list) || len(list) != 1 {
					t.Fatalf("got %v, want one positioned problem", err)
				}
				e := list[0]
				if e.Pos.File != child || e.Pos.Line != 3 || e.Pos.Col != 10 || e.Field != "extends" {
					t.Errorf("at %s (%s), want %s:3:10 (extends)", e.Pos, e.Field, child)
				}
				if !strings.Contains(e.Msg, "parent.yaml "+tt.want) {
					t.Errorf("message %q does not say parent.yaml %s", e.Msg, tt.want)
				}
			})
		})
	}
}

// loadBounded loads ref, failing the test when that takes more than 5 seconds
// (a blocking open of a FIFO would never end).
func loadBounded(t *testing.T, locs profile.Locations, ref string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := locs.Load(ref)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("loading %q still blocks after 5s", ref)
		return nil
	}
}
