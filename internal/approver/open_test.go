//go:build linux

package approver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpen: the browser is handed a private file that redirects to the
// address, never the address on its command line; an opener that fails is
// an error, and leaves no file.
func TestOpen(t *testing.T) {
	bin, state := t.TempDir(), t.TempDir()
	got := filepath.Join(t.TempDir(), "got")
	script := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + got + "\ncat \"$1\" >> " + got + "\nstat -c %a \"$1\" \"$(dirname \"$1\")\" >> " + got + "\n"
	if err := os.WriteFile(filepath.Join(bin, "xdg-open"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	const url = "http://127.0.0.1:1234/s3cret/"
	remove, err := Open(context.Background(), url, state)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	if strings.Contains(lines[0], "s3cret") || !strings.HasPrefix(lines[0], state) {
		t.Fatalf("the opener's argument: %q", lines[0])
	}
	if !strings.Contains(string(data), `content="0;url=`+url+`"`) || !strings.Contains(string(data), "600\n700\n") {
		t.Fatalf("the opener got:\n%s", data)
	}
	remove()
	if left, _ := os.ReadDir(state); len(left) != 0 {
		t.Fatalf("left in the state directory: %v", left)
	}

	os.WriteFile(filepath.Join(bin, "xdg-open"), []byte("#!/bin/sh\necho 'no method available' >&2\nexit 3\n"), 0o755)
	if _, err := Open(context.Background(), url, state); err == nil || !strings.Contains(err.Error(), "no method available") {
		t.Fatalf("a failing opener: %v", err)
	}
	if left, _ := os.ReadDir(state); len(left) != 0 {
		t.Fatalf("left in the state directory: %v", left)
	}
}
