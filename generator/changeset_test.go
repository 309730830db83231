package generator_test

import (
	"errors"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
)

// An overlay cannot be given a directory whose path holds a comma or a
// colon: the engine splits its options at commas, overlayfs its lower
// directories at colons. Generate refuses it, naming the directory.
func TestChangesetOverlayPathRefused(t *testing.T) {
	t.Parallel()
	p, err := profile.Locations{}.Load("testdata/changeset-copy/profile.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, ws := range map[string]string{"comma": "/home/dev/a,b", "colon": "/home/dev/a:b"} {
		t.Run(name, func(t *testing.T) {
			h := fixtureHost(t, p)
			h.Workspace = ws
			cs := &generator.Changeset{ID: "x", Mode: generator.ChangesetOverlay}
			for _, m := range generator.ChangesetMounts(p, h) {
				m.UpperDir, m.WorkDir = "/state/"+m.Name+"/upper", "/state/"+m.Name+"/work"
				cs.Mounts = append(cs.Mounts, m)
			}
			h.Changeset = cs
			_, err := generator.Generate(p, h, generator.Options{Project: project})
			if !errors.Is(err, generator.ErrOverlayPath) {
				t.Fatalf("Generate: %v, want ErrOverlayPath", err)
			}
			// A copy carries any path.
			cs.Mode = generator.ChangesetCopy
			if _, err := generator.Generate(p, h, generator.Options{Project: project}); err != nil {
				t.Fatalf("Generate, copy: %v", err)
			}
		})
	}
}
