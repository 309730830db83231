package profile_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/profile"
)

// TestDelta: trust shows what a repository profile grants beyond what it
// builds on outside the workspace, a line each: set and changed fields,
// items added to lists, replaced lists, dropped fields. Repository files it
// extends are part of what it grants.
func TestDelta(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"cfg/team.yaml":        "extends: offline\ndescription: team\n",
		"ws/.propio/base.yaml": "extends: ../../cfg/team.yaml\nenv:\n  pass: [GOFLAGS]\n",
		"ws/.propio/sandbox.yaml": "extends: ./base.yaml\ndescription: repo\nimage: mine:1\ncommand: [make, test]\n" +
			"network:\n  mode: open\nworkspace:\n  hide: [secrets]\nmounts:\n  - {source: /data, target: /data}\nresources: {memory: 4g}\n",
		"ws/alone.yaml": "image: mine:1\nnetwork: {mode: open}\n",
	})
	ws := filepath.Join(dir, "ws")
	locs := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: ws}
	delta := func(leaf string) (string, []string) {
		t.Helper()
		p, err := locs.ResolveFile(filepath.Join(ws, leaf))
		if err != nil {
			t.Fatal(err)
		}
		base, err := p.TrustedBase(ws)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := profile.Delta(base, p)
		if err != nil {
			t.Fatal(err)
		}
		return base.Meta.File, lines
	}
	from, got := delta(".propio/sandbox.yaml")
	want := []string{
		"image: mine:1 (was propio-sandbox/agent:latest)",
		"command: [make, test] (was [bash])",
		"workspace.hide += secrets",
		"mounts += {source: /data, target: /data, mode: ro}",
		"env.pass += GOFLAGS",
		"network.mode: open (was none)",
		"resources.memory: 4g (was 2g)",
		"build: unset (was {context: '${PROPIO_HOME}', dockerfile: Dockerfile})", // another image: not the parent's build
	}
	if !strings.HasSuffix(from, filepath.Join("cfg", "team.yaml")) || !slices.Equal(got, want) {
		t.Errorf("delta from %s:\n%s\nwant:\n%s", from, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	from, got = delta("alone.yaml")
	if from != "the defaults" || !slices.Contains(got, "network.mode: open (was none)") || !slices.Contains(got, "image: mine:1") {
		t.Errorf("delta of a profile that extends nothing, from %s:\n%s", from, strings.Join(got, "\n"))
	}
}
