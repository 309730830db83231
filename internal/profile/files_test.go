package profile_test

import (
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/profiles"
)

// shippedLimits is a modest host that every shipped profile must fit (run's
// preflight would refuse one that asks for more).
var shippedLimits = profile.Limits{CPUs: 4, Memory: 8 << 30}

// TestShippedProfiles checks every profile file in profiles/ and examples/,
// hidden directories included, against the schema and the semantic checks.
func TestShippedProfiles(t *testing.T) {
	var files []string
	for _, root := range []string{"../../profiles", "../../examples"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"../../profiles/open.yaml", "../../examples/node-agent/.propio/sandbox.yaml"} {
		if !slices.Contains(files, filepath.FromSlash(want)) {
			t.Fatalf("walk found %q, not %s", files, want)
		}
	}
	for _, path := range files {
		t.Run(strings.TrimPrefix(filepath.ToSlash(path), "../../"), func(t *testing.T) {
			t.Parallel()
			// An empty config directory: extends by name must reach the built-ins.
			locs := profile.Locations{ConfigDir: t.TempDir(), Workspace: t.TempDir()}
			p, err := locs.ResolveFile(path)
			if err == nil {
				err = p.Check()
			}
			if err != nil {
				t.Errorf("%s:\n%v", path, err)
			}
			if err == nil && (p.Resources.CPUs > shippedLimits.CPUs || int64(p.Resources.Memory) > shippedLimits.Memory) {
				t.Errorf("%s asks for cpus %g and memory %s, more than a modest host's %g and %s", path, p.Resources.CPUs, p.Resources.Memory, shippedLimits.CPUs, profile.ByteSize(shippedLimits.Memory))
			}
		})
	}
}

func TestBuiltinsLoad(t *testing.T) {
	names := profiles.Names()
	if !slices.Contains(names, profile.DefaultBuiltin) {
		t.Fatalf("built-ins %q lack the default %q", names, profile.DefaultBuiltin)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, err := profile.Locations{}.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			if !p.Meta.Builtin() || p.Meta.File != "builtin:"+name {
				t.Errorf("meta %+v, want the built-in %s", p.Meta, name)
			}
			if p.Description == "" {
				t.Error("no description: `propio-sandbox profiles` would list it blank")
			}
		})
	}
}

func TestDefaultIsTheBuiltinWithoutARepositoryProfile(t *testing.T) {
	t.Parallel()
	p, err := profile.Locations{ConfigDir: t.TempDir(), Workspace: t.TempDir()}.Load("")
	if err != nil {
		t.Fatal(err)
	}
	if p.Meta.File != "builtin:"+profile.DefaultBuiltin {
		t.Errorf("loaded %s, want builtin:%s", p.Meta.File, profile.DefaultBuiltin)
	}
}
