package profile_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/profiles"
)

// resolve writes files under a new directory and resolves the one at leaf
// (relative to it), as `validate` does. It returns the profile and the
// directory.
func resolve(t *testing.T, files map[string]string, leaf string) (*profile.Profile, string) {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, files)
	locs := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: filepath.Join(dir, "ws")}
	p, err := locs.ResolveFile(filepath.Join(dir, filepath.FromSlash(leaf)))
	if err != nil {
		t.Fatalf("resolving %s: %v", leaf, err)
	}
	return p, dir
}

func TestExtendsMerge(t *testing.T) {
	tests := map[string]struct {
		parent string // parent.yaml
		child  string // child.yaml, which extends ./parent.yaml
		got    func(*profile.Profile) any
		want   any
	}{
		"maps merge, the child's value winning": {
			parent: "image: a\nenv:\n  set: {A: parent, B: parent}\n",
			child:  "env:\n  set: {B: child, C: child}\n",
			got:    func(p *profile.Profile) any { return p.Env.Set },
			want:   map[string]string{"A": "parent", "B": "child", "C": "child"},
		},
		"scalars override": {
			parent: "image: a\nnetwork: {mode: open}\n",
			child:  "network: {mode: none}\n",
			got:    func(p *profile.Profile) any { return p.Network.Mode },
			want:   "none",
		},
		"description overrides": {
			parent: "image: a\ndescription: parent\n",
			child:  "description: child\n",
			got:    func(p *profile.Profile) any { return p.Description },
			want:   "child",
		},
		"unset in the child keeps the parent's": {
			parent: "image: parent/image\nuser: root\nunsafe: [root-user]\n",
			child:  "description: child\n",
			got:    func(p *profile.Profile) any { return []string{p.Image, p.User.String()} },
			want:   []string{"parent/image", "root"},
		},
		"lists append without duplicates, parent first": {
			parent: "image: a\nworkspace:\n  hide: [.env, '*.pem']\n",
			child:  "workspace:\n  hide: ['*.pem', secrets, .env.local]\n",
			got:    func(p *profile.Profile) any { return p.Workspace.Hide },
			want:   []string{".env", "*.pem", "secrets", ".env.local"},
		},
		"list items that are maps are compared whole": {
			parent: "image: a\nmounts:\n  - {source: /a, target: /a}\n",
			child:  "mounts:\n  - {target: /a, source: /a}\n  - {source: /a, target: /b}\n",
			got: func(p *profile.Profile) any {
				var out []string
				for _, m := range p.Mounts {
					out = append(out, m.Source+":"+m.Target)
				}
				return out
			},
			want: []string{"/a:/a", "/a:/b"},
		},
		"command is replaced whole": {
			parent: "image: a\ncommand: [bash, -l]\n",
			child:  "command: [sh, -c, x, x]\n",
			got:    func(p *profile.Profile) any { return p.Command },
			want:   []string{"sh", "-c", "x", "x"},
		},
		"command is inherited when the child has none": {
			parent: "image: a\ncommand: [bash, -l]\n",
			child:  "description: child\n",
			got:    func(p *profile.Profile) any { return p.Command },
			want:   []string{"bash", "-l"},
		},
		"an empty list in the child adds nothing": {
			parent: "image: a\nenv:\n  pass: [TERM]\n",
			child:  "env:\n  pass: []\n",
			got:    func(p *profile.Profile) any { return p.Env.Pass },
			want:   []string{"TERM"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, _ := resolve(t, map[string]string{
				"parent.yaml": tt.parent,
				"child.yaml":  "extends: ./parent.yaml\n" + tt.child,
			}, "child.yaml")
			if got := tt.got(p); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
			if err := p.Check(); err != nil {
				t.Errorf("Check: %v", err)
			}
		})
	}
}

func TestExtendsFinds(t *testing.T) {
	tests := map[string]struct {
		files map[string]string
		leaf  string   // relative to the test's directory
		chain []string // Meta.Chain[].File, the test's directory written $DIR
	}{
		"a built-in by name": {
			files: map[string]string{"p.yaml": "extends: open\nimage: mine\n"},
			leaf:  "p.yaml",
			chain: []string{"$DIR/p.yaml", "builtin:open"},
		},
		"a user profile by name": {
			files: map[string]string{
				"p.yaml":        "extends: mine\n",
				"cfg/mine.yaml": "extends: ../lib/base.yaml\n",
				"lib/base.yaml": "image: a\n",
			},
			leaf:  "p.yaml",
			chain: []string{"$DIR/p.yaml", "$DIR/cfg/mine.yaml", "$DIR/lib/base.yaml"},
		},
		"a relative path from the file's directory, not the current one": {
			files: map[string]string{
				"sub/deeper/p.yaml": "extends: ../../base/parent.yaml\n",
				"base/parent.yaml":  "extends: ./grand.yaml\n",
				"base/grand.yaml":   "image: a\n",
			},
			leaf:  "sub/deeper/p.yaml",
			chain: []string{"$DIR/sub/deeper/p.yaml", "$DIR/base/parent.yaml", "$DIR/base/grand.yaml"},
		},
		"a user profile that extends its own name gets the built-in": {
			files: map[string]string{"cfg/open.yaml": "extends: open\ndescription: my open\n"},
			leaf:  "cfg/open.yaml",
			chain: []string{"$DIR/cfg/open.yaml", "builtin:open"},
		},
		"another user profile that extends open gets the user's open": {
			files: map[string]string{
				"cfg/open.yaml": "extends: open\ndescription: my open\n",
				"cfg/mine.yaml": "extends: open\n",
			},
			leaf:  "cfg/mine.yaml",
			chain: []string{"$DIR/cfg/mine.yaml", "$DIR/cfg/open.yaml", "builtin:open"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, dir := resolve(t, tt.files, tt.leaf)
			var chain []string
			for _, s := range p.Meta.Chain {
				chain = append(chain, strings.ReplaceAll(s.File, dir, "$DIR"))
			}
			if !reflect.DeepEqual(chain, tt.chain) {
				t.Errorf("chain %q, want %q", chain, tt.chain)
			}
			if err := p.Check(); err != nil {
				t.Errorf("Check: %v", err)
			}
		})
	}
}

func TestUserProfileNamedLikeABuiltin(t *testing.T) {
	t.Parallel()
	cfg := t.TempDir()
	writeFiles(t, cfg, map[string]string{"open.yaml": "extends: open\ndescription: my open\nresources: {pids: 200}\n"})
	p, err := profile.Locations{ConfigDir: cfg, Workspace: t.TempDir()}.Load("open")
	if err != nil {
		t.Fatal(err)
	}
	if p.Description != "my open" || p.Resources.Pids != 200 || p.Network.Mode != "open" {
		t.Errorf("got description %q, pids %d, network %q; want the user's open over the built-in", p.Description, p.Resources.Pids, p.Network.Mode)
	}
}

func TestExtendsDepth(t *testing.T) {
	// chain writes n files, f0.yaml extending f1.yaml ... up to f(n-1).yaml.
	chain := func(n int) map[string]string {
		files := map[string]string{}
		for i := range n - 1 {
			files[fmt.Sprintf("f%d.yaml", i)] = fmt.Sprintf("extends: ./f%d.yaml\n", i+1)
		}
		files[fmt.Sprintf("f%d.yaml", n-1)] = "image: a\n"
		return files
	}
	t.Run("16 files", func(t *testing.T) {
		t.Parallel()
		p, _ := resolve(t, chain(16), "f0.yaml")
		if len(p.Meta.Chain) != 16 {
			t.Errorf("chain of %d files, want 16", len(p.Meta.Chain))
		}
	})
	t.Run("17 files", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		writeFiles(t, dir, chain(17))
		got := validate(t, profile.Locations{}, filepath.Join(dir, "f0.yaml"), dir)
		want := "$DIR/f15.yaml:1:10: extends: extends chain is deeper than 16: $DIR/f0.yaml -> $DIR/f1.yaml -> "
		if len(got) != 1 || !strings.HasPrefix(got[0], want) || !strings.HasSuffix(got[0], " -> $DIR/f16.yaml") {
			t.Errorf("got %q, want one error starting %q and ending with f16.yaml", got, want)
		}
	})
}

func TestMetaChain(t *testing.T) {
	t.Parallel()
	files := map[string]string{
		"p.yaml":    "extends: ./base.yaml\n# leaf\n",
		"base.yaml": "extends: offline\n# base\n",
	}
	p, dir := resolve(t, files, "p.yaml")
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	builtin, err := fs.ReadFile(profiles.FS, "offline.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := profile.Meta{
		Name: filepath.Join(dir, "p.yaml"),
		File: filepath.Join(dir, "p.yaml"),
		Chain: []profile.Source{
			{File: filepath.Join(dir, "p.yaml"), Path: filepath.Join(dir, "p.yaml"), Real: filepath.Join(real, "p.yaml"), SHA256: sum([]byte(files["p.yaml"]))},
			{File: filepath.Join(dir, "base.yaml"), Path: filepath.Join(dir, "base.yaml"), Real: filepath.Join(real, "base.yaml"), SHA256: sum([]byte(files["base.yaml"]))},
			{File: "builtin:offline", SHA256: sum(builtin)},
		},
	}
	if !reflect.DeepEqual(p.Meta, want) {
		t.Errorf("meta\n%+v\nwant\n%+v", p.Meta, want)
	}
	if p.Meta.Builtin() {
		t.Error("Builtin() is true for a chain whose leaf is a file")
	}
}

func TestDirOfDeclaringFile(t *testing.T) {
	t.Parallel()
	p, dir := resolve(t, map[string]string{
		"child/p.yaml": "extends: ../base/parent.yaml\n" +
			"mounts: [{source: ./cache, target: /cache}]\n" +
			"build: {dockerfile: Dockerfile.dev}\n",
		"base/parent.yaml": "image: a\n" +
			"mounts: [{source: ./data, target: /data}]\n" +
			"build: {context: .}\n",
	}, "child/p.yaml")
	got := map[string]string{
		"mounts[0]": p.Mounts[0].Dir,
		"mounts[1]": p.Mounts[1].Dir,
		"build":     p.Build.Dir,
	}
	want := map[string]string{
		"mounts[0]": filepath.Join(dir, "base"),
		"mounts[1]": filepath.Join(dir, "child"),
		"build":     filepath.Join(dir, "base"), // the file that set context
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("dirs %v, want %v", got, want)
	}

	p, dir = resolve(t, map[string]string{
		"child/p.yaml":     "extends: ../base/parent.yaml\nbuild: {context: ../ctx}\n",
		"base/parent.yaml": "image: a\nbuild: {context: ., dockerfile: D}\n",
	}, "child/p.yaml")
	if want := filepath.Join(dir, "child"); p.Build.Dir != want || p.Build.Dockerfile != "D" {
		t.Errorf("build dir %q dockerfile %q, want %q and D", p.Build.Dir, p.Build.Dockerfile, want)
	}
}

// TestExtendsBuild: a child drops its parent's build with build: null, and
// one that names another image never inherits the build of the parent's
// (which would make the parent's image under the child's tag).
func TestExtendsBuild(t *testing.T) {
	t.Parallel()
	parent := "image: base\nbuild: {context: ., dockerfile: D, target: t}\n"
	tests := map[string]struct {
		child string // extends ./parent.yaml
		want  *profile.Build
	}{
		"inherited":                    {child: "description: child\n", want: &profile.Build{Context: ".", Dockerfile: "D", Target: "t"}},
		"same image, merged":           {child: "image: base\nbuild: {target: u}\n", want: &profile.Build{Context: ".", Dockerfile: "D", Target: "u"}},
		"null drops it":                {child: "build: null\n"},
		"null with the same image":     {child: "image: base\nbuild:\n"},
		"another image, no build":      {child: "image: mine\n"},
		"another image, its own build": {child: "image: mine\nbuild: {context: ./mine}\n", want: &profile.Build{Context: "./mine"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, _ := resolve(t, map[string]string{"parent.yaml": parent, "child.yaml": "extends: ./parent.yaml\n" + tc.child}, "child.yaml")
			if p.Build != nil {
				p.Build.Dir = ""
			}
			if !reflect.DeepEqual(p.Build, tc.want) {
				t.Errorf("build %+v, want %+v", p.Build, tc.want)
			}
		})
	}

	// A grandchild may build again what its parent dropped.
	p, _ := resolve(t, map[string]string{
		"parent.yaml": parent,
		"child.yaml":  "extends: ./parent.yaml\nbuild: null\n",
		"gc.yaml":     "extends: ./child.yaml\nbuild: {context: ./gc}\n",
	}, "gc.yaml")
	if p.Build == nil || p.Build.Context != "./gc" || p.Build.Dockerfile != "" {
		t.Errorf("grandchild's build %+v, want its own context only", p.Build)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	p, _ := resolve(t, map[string]string{"p.yaml": "image: a\n"}, "p.yaml")
	got, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	want := `version: 1
image: a
user: host
workspace:
  target: /workspace
  mode: rw
network:
  mode: none
  host_gateway: true
resources:
  cpus: 2
  memory: 2g
  pids: 100
  tmp: 1g
  disk: 10g
  idle: 30m
security:
  read_only_rootfs: false
  cap_drop:
    - ALL
  no_new_privileges: true
  init: true
ssh_agent: "off"
engine: auto
`
	if string(got) != want {
		t.Errorf("defaults:\n%s\nwant:\n%s", got, want)
	}
	if err := p.Check(); err != nil {
		t.Errorf("Check: %v", err)
	}
}

func TestExplicitEmptyIsKept(t *testing.T) {
	tests := map[string]struct {
		files map[string]string
	}{
		"in the file": {
			files: map[string]string{"p.yaml": "image: a\nsecurity: {cap_drop: []}\n"},
		},
		"in a parent": {
			files: map[string]string{
				"p.yaml":      "extends: ./parent.yaml\n",
				"parent.yaml": "image: a\nsecurity: {cap_drop: []}\n",
			},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, _ := resolve(t, tt.files, "p.yaml")
			if len(p.Security.CapDrop) != 0 {
				t.Errorf("cap_drop %q, want empty as set", p.Security.CapDrop)
			}
		})
	}
}

func TestFitDefaults(t *testing.T) {
	oneCore := profile.Limits{CPUs: 1, Memory: 1 << 30}
	tests := map[string]struct {
		yaml     string
		cpus     float64
		memory   string
		problems string
	}{
		"defaults fit a small host": {
			yaml:   "image: a\n",
			cpus:   1,
			memory: "1g",
		},
		// They load the same on every host: preflight judges them.
		"explicit values are left, not fitted": {
			yaml:   "image: a\nresources:\n  cpus: 2\n  memory: 2g\n",
			cpus:   2,
			memory: "2g",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"p.yaml": tt.yaml})
			got := validate(t, profile.Locations{}, filepath.Join(dir, "p.yaml"), dir)
			if strings.Join(got, "\n") != tt.problems {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), tt.problems)
			}
			p, err := profile.Locations{}.ResolveFile(filepath.Join(dir, "p.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			p.FitDefaults(oneCore)
			if p.Resources.CPUs != tt.cpus || p.Resources.Memory.String() != tt.memory {
				t.Errorf("cpus %g memory %s, want %g and %s", p.Resources.CPUs, p.Resources.Memory, tt.cpus, tt.memory)
			}
		})
	}
}

// resources.disk is parsed into bytes once, when the profile is decoded: a
// child that does not set it keeps its parent's, and it shows as a profile
// would write it.
func TestDiskIsBytes(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		files map[string]string
		want  profile.ByteSize
		shown string
	}{
		"default":    {map[string]string{"p.yaml": "image: a\n"}, 10 << 30, "10g"},
		"set":        {map[string]string{"p.yaml": "image: a\nresources: {disk: 1.5g}\n"}, 1536 << 20, "1536m"},
		"inherited":  {map[string]string{"p.yaml": "extends: base.yaml\nresources: {tmp: 2g}\n", "base.yaml": "image: a\nresources: {disk: 20g}\n"}, 20 << 30, "20g"},
		"child wins": {map[string]string{"p.yaml": "extends: base.yaml\nresources: {disk: 2g}\n", "base.yaml": "image: a\nresources: {disk: 20g}\n"}, 2 << 30, "2g"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, _ := resolve(t, tc.files, "p.yaml")
			if p.Resources.Disk != tc.want || p.Resources.Disk.String() != tc.shown {
				t.Errorf("disk %d (%s), want %d (%s)", p.Resources.Disk, p.Resources.Disk, tc.want, tc.shown)
			}
			if err := p.Check(); err != nil {
				t.Errorf("Check: %v", err)
			}
		})
	}
}
