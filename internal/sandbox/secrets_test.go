package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/profile"
)

// TestReadSecret reads values from each source; each failure says why,
// and no error holds the value.
func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("PROPIO_TEST_SECRET", "sk-from-env")
	t.Setenv("PROPIO_TEST_EMPTY", "")
	tests := map[string]struct {
		from profile.SecretSource
		want string // the value, or what the error says
		err  bool
	}{
		"env":                  {from: profile.SecretSource{Env: "PROPIO_TEST_SECRET"}, want: "sk-from-env"},
		"empty env":            {from: profile.SecretSource{Env: "PROPIO_TEST_EMPTY"}, want: "it is empty", err: true},
		"file, newline":        {from: profile.SecretSource{File: write("nl", "sk-file\n")}, want: "sk-file"},
		"file, crlf":           {from: profile.SecretSource{File: write("crlf", "sk-file\r\n")}, want: "sk-file"},
		"file of two lines":    {from: profile.SecretSource{File: write("two", "sk-a\nsk-b\n")}, want: "line break", err: true},
		"missing file":         {from: profile.SecretSource{File: filepath.Join(dir, "none")}, want: "does not exist", err: true},
		"directory":            {from: profile.SecretSource{File: dir}, want: "directory", err: true},
		"command":              {from: profile.SecretSource{Command: []string{"sh", "-c", "printf '  sk-command \\n'"}}, want: "sk-command"},
		"command fails":        {from: profile.SecretSource{Command: []string{"sh", "-c", "echo sk-leaked; echo 'no token for sk-leaked' >&2; exit 3"}}, want: "exit status 3: no token for ***", err: true},
		"command not found":    {from: profile.SecretSource{Command: []string{"propio-no-such-command"}}, want: "executable file not found", err: true},
		"command prints a lot": {from: profile.SecretSource{Command: []string{"sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x"}}, want: "larger than", err: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			v, err := readSecret(context.Background(), tt.from, dir)
			switch {
			case tt.err && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("readSecret: %q, %v; want an error with %q", v, err, tt.want)
			case tt.err && strings.Contains(err.Error(), "sk-"):
				t.Errorf("the error holds a value: %v", err)
			case !tt.err && (err != nil || v != tt.want):
				t.Errorf("readSecret: %q, %v; want %q", v, err, tt.want)
			}
		})
	}
	// A command runs in the workspace.
	if v, err := readSecret(context.Background(), profile.SecretSource{Command: []string{"pwd"}}, dir); err != nil || v != dir {
		t.Errorf("the command ran in %q (%v), want the workspace %s", v, err, dir)
	}
}
