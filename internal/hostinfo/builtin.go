package hostinfo

import (
	"fmt"
	"io/fs"
	"path/filepath"

	propiosandbox "github.com/propio/propio-sandbox"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/profile"
)

// AgentContextDir is where the default image's build context that ships
// inside the binary is written out, for a build to read.
func (d Dirs) AgentContextDir() string { return filepath.Join(d.State, "agent-image") }

// BuiltinContext is where the build context that a built-in profile sets
// (${PROPIO_HOME}) is read from on this host, for generator.Host: "" (where
// the profile says) when p's build is not a built-in's, or when its
// Dockerfile is there (a checkout, which bin/propio-sandbox makes
// PROPIO_HOME); else the copy inside the binary, written out under dirs
// (WriteAgentContext writes it). A `go install`ed binary has no Dockerfile
// beside it, and needs no checkout.
func BuiltinContext(p *profile.Profile, h generator.Host, dirs Dirs) string {
	if p.Build == nil || !p.Build.Builtin() {
		return ""
	}
	h.BuiltinContext = ""
	if _, df := generator.BuildPaths(p, h); isFile(df) {
		return ""
	}
	return dirs.AgentContextDir()
}

// WriteAgentContext writes the default image's build context that ships
// inside the binary to dir, file by file, leaving files that are as they
// should be untouched.
func WriteAgentContext(dir string) error {
	return fs.WalkDir(propiosandbox.AgentContext, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(propiosandbox.AgentContext, path)
		if err != nil {
			return err
		}
		if err := fsutil.WriteFileIfChanged(filepath.Join(dir, filepath.FromSlash(path)), data, 0o644); err != nil {
			return fmt.Errorf("writing the default image's build context: %w", err)
		}
		return nil
	})
}
