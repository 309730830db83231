package propiosandbox_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	propiosandbox "github.com/propio/propio-sandbox"
	"github.com/propio/propio-sandbox/internal/buildinputs"
)

// TestAgentContextIsTheCheckouts: the copy inside the binary is the
// top-level Dockerfile and .dockerignore, byte for byte.
func TestAgentContextIsTheCheckouts(t *testing.T) {
	n := 0
	err := fs.WalkDir(propiosandbox.AgentContext, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		embedded, err := fs.ReadFile(propiosandbox.AgentContext, path)
		if err != nil {
			return err
		}
		onDisk, err := os.ReadFile(filepath.FromSlash(path))
		if err != nil {
			return err
		}
		if !bytes.Equal(embedded, onDisk) {
			t.Errorf("the embedded %s differs from the top-level one", path)
		}
		return nil
	})
	if err != nil || n != 2 {
		t.Fatalf("walking the embedded context: %v (%d files, want Dockerfile and .dockerignore)", err, n)
	}
}

// TestAgentContextHasWhatTheDockerfileCopies: every file the Dockerfile
// copies by name ships with it. A COPY added to the Dockerfile must add its
// source to the embed pattern (and re-include it in .dockerignore).
func TestAgentContextHasWhatTheDockerfileCopies(t *testing.T) {
	dockerfile, err := fs.ReadFile(propiosandbox.AgentContext, "Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range buildinputs.Sources(dockerfile) {
		if _, err := fs.Stat(propiosandbox.AgentContext, src); err != nil {
			t.Errorf("the Dockerfile copies %s, which the embedded context lacks: %v", src, err)
		}
	}
}
