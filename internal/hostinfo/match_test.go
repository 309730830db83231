package hostinfo

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
)

// rules loads a profile file with these readonly and hide patterns, one a
// line, so that warnings carry real positions: readonly[i] is on line 6+i,
// hide[j] on line 7+len(readonly)+j (6+j without readonly), column 7.
func rules(t *testing.T, readonly, hide []string) *profile.Profile {
	t.Helper()
	var b strings.Builder
	b.WriteString("version: 1\nimage: x\nworkspace:\n  target: /workspace\n")
	for _, list := range []struct {
		key  string
		pats []string
	}{{"readonly", readonly}, {"hide", hide}} {
		if len(list.pats) == 0 {
			continue
		}
		b.WriteString("  " + list.key + ":\n")
		for _, p := range list.pats {
			fmt.Fprintf(&b, "    - %q\n", p)
		}
	}
	file := filepath.Join(t.TempDir(), "profile.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Locations{}.LoadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// build makes a workspace, and a directory outside it, from specs:
//
//	path           a file holding "secret:path"
//	path/          a directory
//	path -> T      a symbolic link to T ($OUT: the outside directory, $WS: the workspace)
//	path => other  another name (hard link) of the file other
func build(t *testing.T, specs ...string) (ws, out string) {
	t.Helper()
	base := t.TempDir()
	if real, err := filepath.EvalSymlinks(base); err == nil {
		base = real
	}
	ws, out = filepath.Join(base, "ws"), filepath.Join(base, "outside")
	for _, d := range []string{ws, out} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(out, "config"), []byte("outside secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		s = strings.NewReplacer("$OUT", out, "$WS", ws).Replace(s)
		var err error
		switch {
		case strings.Contains(s, " -> "):
			name, target, _ := strings.Cut(s, " -> ")
			p := filepath.Join(ws, name)
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.Symlink(target, p)
			}
		case strings.Contains(s, " => "):
			name, other, _ := strings.Cut(s, " => ")
			p := filepath.Join(ws, name)
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.Link(filepath.Join(ws, other), p)
			}
		case strings.HasSuffix(s, "/"):
			err = os.MkdirAll(filepath.Join(ws, s), 0o755)
		default:
			p := filepath.Join(ws, s)
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.WriteFile(p, []byte("secret:"+s), 0o644)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return ws, out
}

// hidden and ro are the matches of a hidden or read-only file or directory.
func hidden(path string) generator.Match {
	return generator.Match{Path: strings.TrimSuffix(path, "/"), Dir: strings.HasSuffix(path, "/"), Hide: true}
}

func ro(path string) generator.Match {
	return generator.Match{Path: strings.TrimSuffix(path, "/"), Dir: strings.HasSuffix(path, "/")}
}

func TestMatchLinks(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		tree             []string
		readonly, hide   []string
		want             []generator.Match
		warnings         []string // $F: the profile file; $OUT, $WS as in build
		noOutsideContent bool
	}{
		"readonly through a linked directory": {
			tree:     []string{".git -> $OUT", "src/main.go"},
			readonly: []string{".git/config", ".git/hooks"},
			warnings: []string{
				"workspace.readonly[0] ($F:6:7): .git is a symbolic link (to $OUT): not followed, nothing mounted for .git/config",
				"workspace.readonly[1] ($F:7:7): .git is a symbolic link (to $OUT): not followed, nothing mounted for .git/hooks",
			},
		},
		"readonly through a link deeper down, and a glob": {
			tree:     []string{"conf/app -> $OUT", "conf/real/settings.json"},
			readonly: []string{"conf/*/config", "conf/*/settings.json"},
			want:     []generator.Match{ro("conf/real/settings.json")},
			warnings: []string{
				"workspace.readonly[0] ($F:6:7): conf/app is a symbolic link (to $OUT): not followed, nothing mounted for conf/*/config",
				"workspace.readonly[1] ($F:7:7): conf/app is a symbolic link (to $OUT): not followed, nothing mounted for conf/*/settings.json",
			},
		},
		"readonly on a link, even one within the workspace": {
			tree:     []string{".propio -> real", "real/sandbox.yaml"},
			readonly: []string{"/.propio"},
			warnings: []string{"workspace.readonly[0] ($F:6:7): .propio is a symbolic link (to real): not followed, nothing mounted for /.propio"},
		},
		"readonly by name on a link": {
			tree:     []string{"a/settings.json -> ../b/settings.json", "b/settings.json"},
			readonly: []string{"settings.json"},
			want:     []generator.Match{ro("b/settings.json")},
			warnings: []string{"workspace.readonly[0] ($F:6:7): a/settings.json is a symbolic link (to ../b/settings.json): not followed, nothing mounted for settings.json"},
		},
		"hide through a link out of the workspace": {
			tree:     []string{"conf -> $OUT"},
			hide:     []string{"conf/config"},
			warnings: []string{"workspace.hide[0] ($F:6:7): conf is a symbolic link (to $OUT) that leads out of the workspace: not followed, nothing mounted for conf/config"},
		},
		"hide a link: its target is hidden": {
			tree: []string{".env -> real/prod.env", "real/prod.env"},
			hide: []string{".env"},
			want: []generator.Match{hidden("real/prod.env")},
		},
		"hide a link to a directory": {
			tree: []string{"secrets -> vault", "vault/key"},
			hide: []string{"/secrets"},
			want: []generator.Match{hidden("vault/")},
		},
		"hide a chain of links, with ..": {
			tree: []string{"app/.env -> ../links/env", "links/env -> ../real/./prod.env", "real/prod.env"},
			hide: []string{".env"},
			want: []generator.Match{hidden("real/prod.env")},
		},
		"hide through a linked directory within the workspace": {
			tree: []string{"conf -> deploy/conf", "deploy/conf/secret.json", "deploy/conf/public.json"},
			hide: []string{"conf/secret.json", "conf/*.key"},
			want: []generator.Match{hidden("deploy/conf/secret.json")},
		},
		"an absolute link beneath the sandbox's workspace": {
			tree: []string{".env -> /workspace/real/prod.env", "real/prod.env"},
			hide: []string{".env"},
			want: []generator.Match{hidden("real/prod.env")},
		},
		"an absolute link to the host's workspace path is another file inside": {
			tree:     []string{".env -> $WS/real/prod.env", "real/prod.env"},
			hide:     []string{".env"},
			warnings: []string{"workspace.hide[0] ($F:6:7): .env is a symbolic link (to $WS/real/prod.env) that names the workspace by its host path, which the sandbox does not have (make the link relative): not followed, nothing mounted for .env"},
		},
		"a relative link out of the workspace": {
			tree:     []string{".env -> sub/../../outside/config", "sub/"},
			hide:     []string{".env"},
			warnings: []string{"workspace.hide[0] ($F:6:7): .env is a symbolic link (to sub/../../outside/config) that leads out of the workspace: not followed, nothing mounted for .env"},
		},
		"a loop": {
			tree:     []string{".env -> a", "a -> .env"},
			hide:     []string{".env"},
			warnings: []string{"workspace.hide[0] ($F:6:7): .env is a symbolic link (to a) that passes more than 40 symbolic links: not followed, nothing mounted for .env"},
		},
		"a dangling link": {
			tree:     []string{".env -> gone/prod.env"},
			hide:     []string{".env"},
			warnings: []string{"workspace.hide[0] ($F:6:7): .env is a symbolic link (to gone/prod.env) that leads to gone, which does not exist in the workspace: not followed, nothing mounted for .env"},
		},
		"a link through a file": {
			tree:     []string{".env -> file/x", "file"},
			hide:     []string{".env"},
			warnings: []string{"workspace.hide[0] ($F:6:7): .env is a symbolic link (to file/x) that leads through file, which is not a directory: not followed, nothing mounted for .env"},
		},
		"a link to the workspace itself": {
			tree:     []string{"all -> ."},
			hide:     []string{"all"},
			warnings: []string{"workspace.hide[0] ($F:6:7): all is a symbolic link (to .) that leads to the workspace itself: not followed, nothing mounted for all"},
		},
		"a name walk never goes through a linked directory": {
			tree: []string{"vendor -> $OUT", "lib -> src", "src/.env"},
			hide: []string{".env", "config"},
			want: []generator.Match{hidden("src/.env")},
		},
		"a name that prints oddly is quoted": {
			tree:     []string{"x\x1b[2J.pem -> $OUT/config"},
			hide:     []string{"*.pem"},
			warnings: []string{`workspace.hide[0] ($F:6:7): "x\x1b[2J.pem" is a symbolic link (to $OUT/config) that leads out of the workspace: not followed, nothing mounted for *.pem`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ws, out := build(t, tc.tree...)
			p := rules(t, tc.readonly, tc.hide)
			got, warnings, err := Match(ws, p)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) && len(got)+len(tc.want) > 0 {
				t.Errorf("matches:\n got %+v\nwant %+v", got, tc.want)
			}
			var want []string
			for _, w := range tc.warnings {
				want = append(want, strings.NewReplacer("$F", p.Meta.File, "$OUT", out, "$WS", ws).Replace(w))
			}
			if !slices.Equal(warnings, want) {
				t.Errorf("warnings:\n got %q\nwant %q", warnings, want)
			}
			// Nothing matched is a link, or below one: the engine resolves
			// none of them.
			for _, m := range got {
				if real, err := filepath.EvalSymlinks(filepath.Join(ws, m.Path)); err != nil || real != filepath.Join(ws, m.Path) {
					t.Errorf("%s is mounted through a link (to %s, %v)", m.Path, real, err)
				}
			}
		})
	}
}

func TestMatchOtherNames(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		tree           []string
		readonly, hide []string
		want           []generator.Match
	}{
		"a hard link of a file hidden by name": {
			tree: []string{".env", "notes.txt => .env", "docs/copy => .env", "other.txt"},
			hide: []string{".env"},
			want: []generator.Match{hidden(".env"), hidden("docs/copy"), hidden("notes.txt")},
		},
		"a hard link of a file hidden by path, without a name walk": {
			tree: []string{"config/prod.env", "backup/prod.txt => config/prod.env"},
			hide: []string{"config/prod.env"},
			want: []generator.Match{hidden("backup/prod.txt"), hidden("config/prod.env")},
		},
		"a hard link of a file hidden by path, collected by the name walk": {
			tree: []string{"config/prod.env", "backup/prod.txt => config/prod.env", "a/.netrc"},
			hide: []string{"config/prod.env", ".netrc"},
			want: []generator.Match{hidden("a/.netrc"), hidden("backup/prod.txt"), hidden("config/prod.env")},
		},
		"a hard link of a file below a hidden directory": {
			tree: []string{"secrets/deep/key", "secrets/other", "key.bak => secrets/deep/key", "secrets/again => secrets/deep/key"},
			hide: []string{"secrets"},
			want: []generator.Match{hidden("key.bak"), hidden("secrets/")},
		},
		"a hard link of a link's target": {
			tree: []string{".env -> real/prod.env", "real/prod.env", "old.txt => real/prod.env"},
			hide: []string{".env"},
			want: []generator.Match{hidden("old.txt"), hidden("real/prod.env")},
		},
		"a hard link in a read-only directory": {
			tree:     []string{".env", "conf/env.txt => .env"},
			readonly: []string{"conf"},
			hide:     []string{".env"},
			want:     []generator.Match{hidden(".env"), ro("conf/"), hidden("conf/env.txt")},
		},
		"files with several names that are not hidden stay as they are": {
			tree: []string{"a.txt", "b.txt => a.txt", ".env"},
			hide: []string{".env"},
			want: []generator.Match{hidden(".env")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ws, _ := build(t, tc.tree...)
			got, warnings, err := Match(ws, rules(t, tc.readonly, tc.hide))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) || len(warnings) > 0 {
				t.Errorf("matches:\n got %+v %q\nwant %+v", got, warnings, tc.want)
			}
		})
	}
}

func TestHiddenPathMatch(t *testing.T) {
	t.Parallel()
	pats := []string{".env", "*.pem", "secrets/", "/config/prod.*", "deploy/*/key"}
	for rel, want := range map[string]bool{
		".env":              true,
		"a/b/.env":          true,
		"certs/server.pem":  true,
		"secrets/x/y":       true,
		"app/secrets/x":     true,
		"config/prod.env":   true,
		"a/config/prod.env": false, // anchored
		"config/dev.env":    false,
		"deploy/eu/key":     true,
		"deploy/eu/key/sub": true, // below a hidden directory
		"deploy/key":        false,
		"README":            false,
		".envrc":            false,
	} {
		if got := hiddenPath(pats, rel); got != want {
			t.Errorf("hiddenPath(%q) = %v, want %v", rel, got, want)
		}
	}
}

func TestHiddenTracked(t *testing.T) {
	t.Parallel()
	// .env by its pattern; vault/ as the target of a hidden link, and
	// notes.txt as another name of a hidden file, by what Match found.
	matches := []generator.Match{hidden("vault/"), hidden("notes.txt"), ro(".git/config")}
	paths := []string{".env", ".git/config", "README", "notes.txt", "src/.env", "vault/token", "vaults/x"}
	got := HiddenTracked([]string{".env", "secrets"}, matches, paths)
	if want := []string{".env", "notes.txt", "src/.env", "vault/token"}; !slices.Equal(got, want) {
		t.Errorf("HiddenTracked = %q, want %q", got, want)
	}
}
