package hostinfo

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
)

// TestBuiltinContext: a built-in's build reads ${PROPIO_HOME} when the
// Dockerfile is there, else the copy inside the binary, written out; a
// profile file's build is never redirected.
func TestBuiltinContext(t *testing.T) {
	t.Parallel()
	dirs := Dirs{State: t.TempDir()}
	checkout, empty := tree(t, "Dockerfile"), t.TempDir()
	builtin := &profile.Profile{Build: &profile.Build{Context: "${PROPIO_HOME}", Dockerfile: "Dockerfile"}}
	own := &profile.Profile{Build: &profile.Build{Context: "${PROPIO_HOME}", Dockerfile: "Dockerfile", Dir: "/home/me/profiles"}}
	for _, c := range []struct {
		name string
		p    *profile.Profile
		home string
		want string
	}{
		{"checkout", builtin, checkout, ""},
		{"go install", builtin, empty, dirs.AgentContextDir()},
		{"profile file", own, empty, ""},
		{"no build", &profile.Profile{}, empty, ""},
	} {
		h := generator.Host{Workspace: "/w", PropioHome: c.home}
		if got := BuiltinContext(c.p, h, dirs); got != c.want {
			t.Errorf("%s: BuiltinContext = %q, want %q", c.name, got, c.want)
		}
	}
	h := generator.Host{Workspace: "/w", PropioHome: empty, BuiltinContext: dirs.AgentContextDir()}
	if ctx, df := generator.BuildPaths(builtin, h); ctx != dirs.AgentContextDir() || df != filepath.Join(ctx, "Dockerfile") {
		t.Errorf("BuildPaths = %s, %s; want the written-out context", ctx, df)
	}

	if err := WriteAgentContext(dirs.AgentContextDir()); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dirs.AgentContextDir(), "Dockerfile"))
	want, err2 := os.ReadFile("../../Dockerfile")
	if err != nil || err2 != nil || !bytes.Equal(got, want) {
		t.Errorf("the written-out Dockerfile is not the top-level one: %v %v", err, err2)
	}
}
