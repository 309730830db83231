package guard

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseGitConfig(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		in   string
		want []string // key=value
		bad  bool
	}{
		"sections and subsections": {
			in:   "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://x.test/r.git\n[Branch \"Main\"]\n\tRemote = origin\n",
			want: []string{"core.bare=false", "remote.origin.url=https://x.test/r.git", "branch.Main.remote=origin"},
		},
		"older dotted subsection is lower-cased": {
			in:   "[Remote.Origin]\nurl = u\n",
			want: []string{"remote.origin.url=u"},
		},
		"bare name is true, comments, blank lines": {
			in:   "# c\n; c\n\n[core]\n\tbare\n\tfilemode = true # trailing\n\tsymlinks = false ; trailing\n",
			want: []string{"core.bare=true", "core.filemode=true", "core.symlinks=false"},
		},
		"quotes, escapes, inner spaces, continuation": {
			in:   "[alias]\n\tx = \"a # b\"  c\\td\n\ty = one \\\ntwo\n\tz = a  \"\"  b  \n",
			want: []string{"alias.x=a # b  c\td", "alias.y=one two", "alias.z=a    b"},
		},
		"a variable on the header's line": {
			in:   "[core] fsmonitor = evil\n",
			want: []string{"core.fsmonitor=evil"},
		},
		"subsection escapes": {
			in:   "[includeIf \"gitdir:~/a\\\"b/\"]\n\tpath = x\n",
			want: []string{`includeif.gitdir:~/a"b/.path=x`},
		},
		"CRLF lines": {
			in:   "[core]\r\n\tbare = false\r\n",
			want: []string{"core.bare=false"},
		},
		"variable before a section":      {in: "bare = true\n", bad: true},
		"unterminated quote":             {in: "[a]\n\tb = \"x\n", bad: true},
		"unknown escape":                 {in: "[a]\n\tb = \\q\n", bad: true},
		"bad header":                     {in: "[a \"b\" ]\n", bad: true},
		"comment after bare name":        {in: "[a]\n\tb # c\n", bad: true},
		"NUL byte":                       {in: "[a]\n\tb = \x00\n", bad: true},
		"name with a bad character":      {in: "[a]\n\tb_c = 1\n", bad: true},
		"unterminated subsection":        {in: "[a \"b\n", bad: true},
		"empty section name":             {in: "[]\n", bad: true},
		"header without closing bracket": {in: "[core\n", bad: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			entries, err := parseGitConfig([]byte(tt.in))
			if tt.bad {
				if err == nil {
					t.Fatalf("want an error, got %v", entries)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range entries {
				got = append(got, e.key()+"="+e.Value)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestParseGitConfigAsGit checks the parser against the host's git on the
// same files: every key and value git reads, this parser reads alike.
func TestParseGitConfigAsGit(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	files := []string{
		"[core]\n\tbare = false\n\tfsmonitor = \"touch /x\"\n[remote \"o\"]\n\turl = u # c\n",
		"[Core]\n\tBare\n[a.B]\n\tc = x y  z\n",
		"[alias]\n\tst = !sh -c \\\n  'echo hi'\n[includeIf \"gitdir:/a/\"]\n\tpath = ../x\n",
		"[x] y = 1\n[x \"s p\"]\n\tz = \"q\\\"\\\\\"\n",
	}
	for i, f := range files {
		path := filepath.Join(t.TempDir(), "config")
		if err := os.WriteFile(path, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("git", "config", "--file", path, "--list", "-z").Output()
		if err != nil {
			t.Fatalf("file %d: git config: %v", i, err)
		}
		var want []string
		for _, kv := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
			k, v, _ := strings.Cut(kv, "\n")
			want = append(want, k+"="+v)
		}
		entries, err := parseGitConfig([]byte(f))
		if err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
		var got []string
		for _, e := range entries {
			v := e.Value
			if e.Bare {
				v = ""
			}
			got = append(got, e.key()+"="+v)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("file %d:\ngot  %q\ngit  %q", i, got, want)
		}
	}
}

func TestSanitizeConfig(t *testing.T) {
	t.Parallel()
	initConfig := "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"
	clean, dropped := sanitizeConfig([]byte(initConfig))
	if len(dropped) != 0 || string(clean) != initConfig {
		t.Fatalf("git init's configuration must be kept as it is; dropped %v:\n%s", dropped, clean)
	}

	evil := initConfig +
		"\tfsmonitor = touch /tmp/x\n\thooksPath = evil\n\tsshCommand = evil\n\tpager = evil\n" +
		"[remote \"origin\"]\n\turl = https://x.test/r.git\n\tuploadpack = evil\n" +
		"[alias]\n\tst = !evil\n[include]\n\tpath = evil\n[filter \"x\"]\n\tclean = evil\n" +
		"[diff \"x\"]\n\ttextconv = evil\n[submodule \"s\"]\n\tupdate = !evil\n\turl = ../s\n"
	clean, dropped = sanitizeConfig([]byte(evil))
	for _, k := range []string{"core.fsmonitor", "core.hookspath", "core.sshcommand", "core.pager", "remote.origin.uploadpack", "alias.st", "include.path", "filter.x.clean", "diff.x.textconv", "submodule.s.update"} {
		found := false
		for _, d := range dropped {
			found = found || d == k
		}
		if !found {
			t.Errorf("%s was not dropped (dropped: %v)", k, dropped)
		}
	}
	if strings.Contains(string(clean), "evil") {
		t.Fatalf("the clean configuration still says evil:\n%s", clean)
	}
	entries, err := parseGitConfig(clean)
	if err != nil {
		t.Fatalf("the clean configuration does not parse: %v\n%s", err, clean)
	}
	var keys []string
	for _, e := range entries {
		keys = append(keys, e.key()+"="+e.Value)
	}
	want := []string{"core.repositoryformatversion=0", "core.filemode=true", "core.bare=false", "core.logallrefupdates=true", "remote.origin.url=https://x.test/r.git", "submodule.s.url=../s"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("kept %q, want %q", keys, want)
	}

	clean, dropped = sanitizeConfig([]byte("[core\n\tfsmonitor = evil\n"))
	if len(dropped) == 0 || string(clean) != string(minimalConfig) {
		t.Fatalf("an unreadable configuration must be replaced whole; got %v:\n%s", dropped, clean)
	}
}
