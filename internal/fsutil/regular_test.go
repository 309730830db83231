package fsutil

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestOpenRegular(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("content"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	for _, link := range []struct{ name, target string }{
		{"link-to-file", "file"}, {"link-to-fifo", "fifo"}, {"loop-a", "loop-b"}, {"loop-b", "loop-a"}, {"dangling", "nowhere"},
	} {
		if err := os.Symlink(link.target, filepath.Join(dir, link.name)); err != nil {
			t.Fatal(err)
		}
	}
	tests := map[string]struct {
		path    string
		want    string // the content, when it opens
		problem string // what Problem says, when it does not
	}{
		"regular file":           {path: file, want: "content"},
		"link to a regular file": {path: filepath.Join(dir, "link-to-file"), want: "content"},
		"FIFO":                   {path: fifo, problem: "is a FIFO (named pipe), not a regular file"},
		"link to a FIFO":         {path: filepath.Join(dir, "link-to-fifo"), problem: "is a FIFO (named pipe), not a regular file"},
		"socket":                 {path: sock, problem: "is a socket, not a regular file"},
		"character device":       {path: "/dev/null", problem: "is a character device, not a regular file"},
		"directory":              {path: dir, problem: "is a directory, not a regular file"},
		"symbolic link loop":     {path: filepath.Join(dir, "loop-a"), problem: "is a symbolic link loop"},
		"missing":                {path: filepath.Join(dir, "missing"), problem: "does not exist"},
		"dangling link":          {path: filepath.Join(dir, "dangling"), problem: "does not exist"},
		"below a file":           {path: filepath.Join(file, "x"), problem: "does not exist (a part of its path is not a directory)"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			type result struct {
				data []byte
				err  error
			}
			done := make(chan result, 1)
			go func() {
				data, err := ReadRegular(tt.path, 1<<10)
				done <- result{data, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("ReadRegular(%s) still blocks after 5s", tt.path)
			}
			if tt.problem == "" {
				if r.err != nil || string(r.data) != tt.want {
					t.Fatalf("got %q, %v; want %q", r.data, r.err, tt.want)
				}
				return
			}
			if r.err == nil {
				t.Fatalf("got %q, want an error saying it %s", r.data, tt.problem)
			}
			if got := Problem(r.err); !strings.HasPrefix(got, tt.problem) {
				t.Errorf("Problem = %q, want it to start with %q (error %v)", got, tt.problem, r.err)
			}
			var nr *NotRegularError
			if errors.As(r.err, &nr) && !strings.Contains(r.err.Error(), tt.path) {
				t.Errorf("the error %q does not name %s", r.err, tt.path)
			}
		})
	}
}

func TestReadRegularBound(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(path, make([]byte, 11), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRegular(path, 10); !errors.Is(err, ErrTooLarge) {
		t.Errorf("11 bytes with a bound of 10: %v, want ErrTooLarge", err)
	}
	if data, err := ReadRegular(path, 11); err != nil || len(data) != 11 {
		t.Errorf("11 bytes with a bound of 11: %d bytes, %v", len(data), err)
	}
	if _, err := ReadRegular(filepath.Join(t.TempDir(), "none"), 10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v, want fs.ErrNotExist", err)
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"real/sub"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []struct{ name, target string }{
		{"abs", filepath.Join(dir, "real")},
		{"rel", "real/sub"},
		{"dangling", filepath.Join(dir, "real", "later")},
		{"chain", "abs"},
		{"loop", "loop"},
		{"up", "real/sub/.."},
	} {
		if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	tests := map[string]struct {
		path   string
		want   string
		exists bool
	}{
		"no links":                    {"real/sub", "real/sub", true},
		"absolute link":               {"abs/sub", "real/sub", true},
		"relative link":               {"rel", "real/sub", true},
		"a link to a link":            {"chain/sub", "real/sub", true},
		"missing below a link":        {"abs/missing/deeper", "real/missing/deeper", false},
		"a dangling link is followed": {"dangling", "real/later", false},
		"below a dangling link":       {"dangling/x", "real/later/x", false},
		"a loop stops where it is":    {"loop/x", "loop/x", false},
		"dot-dot after a link":        {"up/sub", "real/sub", true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, exists := Resolve(filepath.Join(dir, tt.path))
			if want := filepath.Join(dir, tt.want); got != want || exists != tt.exists {
				t.Errorf("Resolve(%s) = %s, %v; want %s, %v", tt.path, got, exists, want, tt.exists)
			}
		})
	}
}
