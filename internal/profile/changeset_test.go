package profile_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/profile"
)

func TestForceChangeset(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"ok.yaml":     "image: a\nworkspace:\n  hide: [.env]\nmounts:\n  - {source: /b, target: /b, mode: changeset}\n",
		"inside.yaml": "image: a\nmounts:\n  - {source: /b, target: /workspace/b}\n",
	})
	locs := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: dir}

	p, err := locs.LoadFile(filepath.Join(dir, "ok.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Changeset() {
		t.Error("a profile with a changeset mount: Changeset() = false")
	}
	if err := p.ForceChangeset(); err != nil {
		t.Fatalf("ForceChangeset: %v", err)
	}
	if p.Workspace.Mode != profile.ModeChangeset {
		t.Errorf("workspace.mode = %q, want changeset", p.Workspace.Mode)
	}

	p, err = locs.LoadFile(filepath.Join(dir, "inside.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Changeset() {
		t.Error("a profile without changeset mode: Changeset() = true")
	}
	err = p.ForceChangeset()
	if err == nil || !strings.Contains(err.Error(), "inside.yaml:3:26: mounts[0].target: /workspace/b is inside the workspace") {
		t.Errorf("ForceChangeset with a mount inside the workspace: %v", err)
	}
}
