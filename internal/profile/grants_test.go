package profile_test

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/schema"
)

// unsafeMsg reads the kind of an unsafe-grant problem from its message.
var unsafeMsg = regexp.MustCompile(`^unsafe grant (\S+) (in a repository profile|not named in unsafe): `)

// grantProblems renders the problems of err as "FILE:LINE:COL FIELD KIND
// NAME" (KIND: repo or unnamed; for unsafe in a repository file, "unsafe
// repo"), FILE relative to dir, so a table can say exactly where each is.
func grantProblems(t *testing.T, err error, dir string) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var list profile.List
	if !errors.As(err, &list) {
		t.Fatalf("got %T %v, want a profile.List", err, err)
	}
	var out []string
	for _, e := range list {
		pos := strings.TrimPrefix(e.Pos.String(), dir+"/")
		switch m := unsafeMsg.FindStringSubmatch(e.Msg); {
		case m != nil && strings.HasPrefix(m[2], "in a repository"):
			out = append(out, pos+" "+e.Field+" repo "+m[1])
		case m != nil:
			out = append(out, pos+" "+e.Field+" unnamed "+m[1])
		case e.Field == "unsafe":
			out = append(out, pos+" unsafe repo")
		default:
			t.Fatalf("a problem that is not about an unsafe grant: %v", e)
		}
		if e.Hint == "" {
			t.Errorf("%v has no hint", e)
		}
	}
	return out
}

// TestUnsafeGrantsWithoutHost: the grants Check judges without the host
// (capabilities, the user, env.pass globs, a mount of / written as such),
// refused unless a user profile names them in unsafe, and always refused
// from a repository profile file, at the field that grants them.
func TestUnsafeGrantsWithoutHost(t *testing.T) {
	implied := []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP"}
	tests := map[string]struct {
		files map[string]string // ws/ is the workspace, cfg/ the user profiles
		ref   string            // "" for ws/.propio/sandbox.yaml, else a user profile name
		want  []string
	}{
		"cap_add SYS_ADMIN": {
			files: map[string]string{"cfg/p.yaml": "image: a\nsecurity: {cap_add: [SYS_ADMIN]}\n"},
			ref:   "p",
			want:  []string{"cfg/p.yaml:2:22 security.cap_add[0] unnamed SYS_ADMIN"},
		},
		"cap_add SYS_ADMIN named in unsafe": {
			files: map[string]string{"cfg/p.yaml": "image: a\nsecurity: {cap_add: [SYS_ADMIN]}\nunsafe: [SYS_ADMIN]\n"},
			ref:   "p",
		},
		"a CAP_ prefix is the same capability": {
			files: map[string]string{"cfg/p.yaml": "image: a\nsecurity:\n  cap_add: [CAP_SYS_PTRACE, CAP_NET_BIND_SERVICE]\n"},
			ref:   "p",
			want:  []string{"cfg/p.yaml:3:13 security.cap_add[0] unnamed SYS_PTRACE"},
		},
		"a capability that keeps isolation needs no unsafe": {
			files: map[string]string{"cfg/p.yaml": "image: a\nsecurity: {cap_add: [NET_BIND_SERVICE, KILL]}\n"},
			ref:   "p",
		},
		"another name in unsafe does not grant it": {
			files: map[string]string{"cfg/p.yaml": "image: a\nsecurity: {cap_add: [NET_ADMIN]}\nunsafe: [NET_RAW]\n"},
			ref:   "p",
			want:  []string{"cfg/p.yaml:2:22 security.cap_add[0] unnamed NET_ADMIN"},
		},
		"cap_drop without ALL keeps the engine's defaults, each reported at cap_drop": {
			files: map[string]string{"cfg/p.yaml": "image: a\nsecurity:\n  cap_drop: [NET_RAW, MKNOD]\n"},
			ref:   "p",
			want: func() []string {
				var out []string
				for _, c := range implied {
					if c != "NET_RAW" && c != "MKNOD" {
						out = append(out, "cfg/p.yaml:3:13 security.cap_drop unnamed "+c)
					}
				}
				return out
			}(),
		},
		"cap_drop without ALL, every capability it keeps named": {
			files: map[string]string{"cfg/p.yaml": "image: a\nsecurity: {cap_drop: []}\nunsafe: [" + strings.Join(implied, ", ") + "]\n"},
			ref:   "p",
		},
		"cap_drop ALL and a dangerous capability added back": {
			files: map[string]string{"cfg/p.yaml": "image: a\nsecurity: {cap_drop: [ALL], cap_add: [DAC_READ_SEARCH]}\n"},
			ref:   "p",
			want:  []string{"cfg/p.yaml:2:39 security.cap_add[0] unnamed DAC_READ_SEARCH"},
		},
		"user root": {
			files: map[string]string{"cfg/p.yaml": "image: a\nuser: root\n"},
			ref:   "p",
			want:  []string{"cfg/p.yaml:2:7 user unnamed root-user"},
		},
		"uid 0": {
			files: map[string]string{"cfg/p.yaml": "image: a\nuser: \"0:1000\"\n"},
			ref:   "p",
			want:  []string{"cfg/p.yaml:2:7 user unnamed root-user"},
		},
		"gid 0 alone is not root": {
			files: map[string]string{"cfg/p.yaml": "image: a\nuser: \"1000:0\"\n"},
			ref:   "p",
		},
		"user root named in unsafe": {
			files: map[string]string{"cfg/p.yaml": "image: a\nuser: root\nunsafe: [root-user]\n"},
			ref:   "p",
		},
		"a mount of / written as such": {
			files: map[string]string{"cfg/p.yaml": "image: a\nmounts: [{source: /, target: /host}]\n"},
			ref:   "p",
			want:  []string{"cfg/p.yaml:2:19 mounts[0].source unnamed host-root"},
		},
		"env.pass '*_*'": {
			files: map[string]string{"cfg/p.yaml": "image: a\nenv: {pass: [AWS_*, '*_*']}\n"},
			ref:   "p",
			want:  []string{"cfg/p.yaml:2:21 env.pass[1] unnamed env-glob"},
		},
		"a repository profile cannot grant what its user parent names": {
			files: map[string]string{
				"cfg/mine.yaml":           "image: a\nunsafe: [SYS_ADMIN, root-user]\n",
				"ws/.propio/sandbox.yaml": "extends: mine\nuser: root\nsecurity: {cap_add: [SYS_ADMIN]}\n",
			},
			want: []string{".propio/sandbox.yaml:2:7 user repo root-user", ".propio/sandbox.yaml:3:22 security.cap_add[0] repo SYS_ADMIN"},
		},
		"a repository profile may extend a user profile's grants": {
			files: map[string]string{
				"cfg/mine.yaml":           "image: a\nuser: root\nsecurity: {cap_add: [SYS_PTRACE]}\nunsafe: [SYS_PTRACE, root-user]\n",
				"ws/.propio/sandbox.yaml": "extends: mine\ndescription: repo\n",
			},
		},
		"unsafe in a repository profile": {
			files: map[string]string{
				"ws/.propio/sandbox.yaml": "image: a\nunsafe: [SYS_ADMIN]\nsecurity: {cap_add: [SYS_ADMIN]}\n",
			},
			want: []string{".propio/sandbox.yaml:2:1 unsafe repo", ".propio/sandbox.yaml:3:22 security.cap_add[0] repo SYS_ADMIN"},
		},
		"unsafe in a repository profile, even empty": {
			files: map[string]string{"ws/.propio/sandbox.yaml": "image: a\nunsafe: []\n"},
			want:  []string{".propio/sandbox.yaml:2:1 unsafe repo"},
		},
		"a repository file that lets the defaults in under a user profile": {
			// The user profile extends a file of the workspace whose
			// cap_drop lacks ALL: the repository file let them in.
			files: map[string]string{
				"cfg/mine.yaml": "extends: ../ws/base.yaml\nunsafe: [" + strings.Join(implied, ", ") + "]\n",
				"ws/base.yaml":  "image: a\nsecurity: {cap_drop: [KILL]}\n",
			},
			ref: "mine",
			want: func() []string {
				var out []string
				for _, c := range implied {
					out = append(out, "ws/base.yaml:2:22 security.cap_drop repo "+c)
				}
				return out
			}(),
		},
		"a repository file that only drops more": {
			files: map[string]string{
				"cfg/mine.yaml":           "image: a\nsecurity: {cap_drop: [KILL]}\nunsafe: [" + strings.Join(implied, ", ") + "]\n",
				"ws/.propio/sandbox.yaml": "extends: mine\nsecurity: {cap_drop: [NET_RAW]}\n",
			},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFiles(t, dir, tt.files)
			locs := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: filepath.Join(dir, "ws")}
			_, err := locs.Load(tt.ref)
			got := grantProblems(t, err, dir)
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestEnvGlobs(t *testing.T) {
	t.Parallel()
	anchored := []string{"AWS_*", "LC_*", "GIT_*", "AWS_?EGION", "TERM", "MY_APP_*"}
	loose := []string{"*_*", "*KEY*", "*_API_KEY", "A*", "*", "?", "A_*B", "_*", "AWS*", "A?_*"}
	for _, pat := range append(anchored, loose...) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"p.yaml": "image: a\nenv: {pass: ['" + pat + "']}\n"})
		_, err := profile.Locations{}.LoadFile(filepath.Join(dir, "p.yaml"))
		got := grantProblems(t, err, dir)
		want := []string(nil)
		if slices.Contains(loose, pat) && pat != "A_*B" {
			want = []string{"p.yaml:2:14 env.pass[0] unnamed env-glob"}
		}
		if !slices.Equal(got, want) {
			t.Errorf("env.pass %q: %q, want %q", pat, got, want)
		}
	}
}

// TestUnsafeSchema: the schema's unsafe enum is exactly the names the
// profile package judges.
func TestUnsafeSchema(t *testing.T) {
	t.Parallel()
	m := regexp.MustCompile(`"unsafe": \{[^}]*"items": \{"enum": \[([^\]]*)\]`).FindSubmatch(schema.ProfileJSON)
	if m == nil {
		t.Fatal("no unsafe enum in the schema")
	}
	var got []string
	for _, s := range strings.Split(string(m[1]), ",") {
		got = append(got, strings.Trim(strings.TrimSpace(s), `"`))
	}
	if want := profile.UnsafeNames(); !slices.Equal(got, want) {
		t.Errorf("schema enum %q, want %q", got, want)
	}
}

// TestGrantsOnHost: mount sources judged on the host, after expansion and
// with links resolved: the engine's socket by any path, a directory holding
// it, /, HOME and its parents, ~/.ssh, ~/.gnupg and cloud credentials, inside
// or containing them.
func TestGrantsOnHost(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{
		"run/docker.sock":         "", // a stand-in: only its path and identity matter
		"home/.ssh/id_ed25519":    "key",
		"home/.gnupg/pubring.kbx": "",
		"home/.aws/credentials":   "",
		"home/.netrc":             "",
		"home/project/notes.txt":  "",
		"data/kube/config":        "",
		"elsewhere/file":          "",
		"ws/.propio/placeholder":  "",
		"cfg/.keep":               "",
	})
	home := filepath.Join(dir, "home")
	for _, l := range []struct{ name, target string }{
		{"links/sock", "../run/docker.sock"},
		{"links/home", "../home"},
		{"links/run", "../run"},
		{"home/.kube", "../data/kube"},
	} {
		if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, l.name)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Link(filepath.Join(dir, "run/docker.sock"), filepath.Join(dir, "elsewhere/hardlink")); err != nil {
		t.Fatal(err)
	}
	host := profile.GrantHost{
		Home:      home,
		Workspace: filepath.Join(dir, "ws"),
		Sockets:   []string{filepath.Join(dir, "run/docker.sock"), filepath.Join(dir, "missing/podman.sock")},
		Resolve:   fsutil.Resolve,
		SameFile: func(a, b string) bool {
			sa, err1 := os.Stat(a)
			sb, err2 := os.Stat(b)
			return err1 == nil && err2 == nil && os.SameFile(sa, sb)
		},
	}
	tests := map[string]struct {
		source string
		want   []string // the names of the grants, in order
	}{
		"the socket":                      {source: "$DIR/run/docker.sock", want: []string{"docker-socket"}},
		"the socket through a link":       {source: "$DIR/links/sock", want: []string{"docker-socket"}},
		"the socket by a hard link":       {source: "$DIR/elsewhere/hardlink", want: []string{"docker-socket"}},
		"the directory of the socket":     {source: "$DIR/run", want: []string{"docker-socket"}},
		"that directory through a link":   {source: "$DIR/links/run/", want: []string{"docker-socket"}},
		"a socket path that is not there": {source: "$DIR/missing/podman.sock", want: []string{"docker-socket"}},
		"the directory of a missing one":  {source: "$DIR/missing", want: nil},
		"/":                               {source: "/", want: []string{"host-root"}},
		"/ by another name":               {source: "$DIR/../../../../../../../../..", want: []string{"host-root"}},
		"HOME":                            {source: "${HOME}", want: []string{"home"}},
		"~":                               {source: "~", want: []string{"home"}},
		"HOME through a link":             {source: "$DIR/links/home", want: []string{"home"}},
		"a parent of HOME":                {source: "$DIR", want: []string{"docker-socket", "home"}},
		"~/.ssh":                          {source: "~/.ssh", want: []string{"ssh"}},
		"a key in ~/.ssh":                 {source: "${HOME}/.ssh/id_ed25519", want: []string{"ssh"}},
		"~/.gnupg":                        {source: "~/.gnupg", want: []string{"gnupg"}},
		"~/.aws/credentials":              {source: "~/.aws/credentials", want: []string{"cloud-credentials"}},
		"~/.netrc":                        {source: "~/.netrc", want: []string{"cloud-credentials"}},
		"~/.kube, a link elsewhere":       {source: "$DIR/data/kube/config", want: []string{"cloud-credentials"}},
		"what holds a linked ~/.kube":     {source: "$DIR/data", want: []string{"cloud-credentials"}},
		"a project below HOME":            {source: "~/project", want: nil},
		"a file elsewhere":                {source: "$DIR/elsewhere/file", want: nil},
		"a relative source":               {source: "../elsewhere", want: nil},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src := strings.ReplaceAll(tt.source, "$DIR", dir)
			cfg := t.TempDir()
			writeFiles(t, cfg, map[string]string{"p.yaml": "image: a\nmounts:\n  - source: '" + src + "'\n    target: /m\n    optional: true\n"})
			// A mount of / written as such is refused by Load already.
			p, err := profile.Locations{Workspace: host.Workspace}.LoadFile(filepath.Join(cfg, "p.yaml"))
			if err == nil {
				var granted []profile.Grant
				granted, err = p.Grants(host)
				if len(granted) > 0 {
					t.Errorf("granted %v without unsafe", granted)
				}
			}
			var names []string
			var list profile.List
			errors.As(err, &list)
			for _, e := range list {
				m := unsafeMsg.FindStringSubmatch(e.Msg)
				if m == nil || e.Field != "mounts[0].source" || e.Pos.Line != 3 || e.Pos.Col != 13 {
					t.Errorf("problem %v: want an unsafe grant at 3:13, mounts[0].source", e)
					continue
				}
				names = append(names, m[1])
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("grants %q, want %q (%v)", names, tt.want, err)
			}
			if len(tt.want) == 0 {
				return
			}
			// Named in unsafe, the same grants are granted, each once.
			writeFiles(t, cfg, map[string]string{"p.yaml": "image: a\nmounts:\n  - source: '" + src + "'\n    target: /m\n    optional: true\nunsafe: [" + strings.Join(tt.want, ", ") + "]\n"})
			p, err = profile.Locations{Workspace: host.Workspace}.LoadFile(filepath.Join(cfg, "p.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			granted, err := p.Grants(host)
			if err != nil {
				t.Fatalf("named in unsafe: %v", err)
			}
			names = nil
			for _, g := range granted {
				names = append(names, g.Name)
				want := "unsafe grant " + g.Name + ": mounts[0].source (" + filepath.Join(cfg, "p.yaml") + ":3:13): "
				if !strings.HasPrefix(g.String(), want) {
					t.Errorf("warning %q, want it to start %q", g.String(), want)
				}
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("granted %q, want %q", names, tt.want)
			}
		})
	}
}

// TestGrantsFromRepository: a mount a repository profile file makes is
// refused whatever unsafe says; the same mount in the user profile it
// extends is granted, and shown.
func TestGrantsFromRepository(t *testing.T) {
	t.Parallel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{
		"home/.ssh/id_ed25519":    "key",
		"cfg/mine.yaml":           "image: a\nmounts: [{source: ~/.ssh, target: /user-ssh}]\nunsafe: [ssh]\n",
		"ws/.propio/sandbox.yaml": "extends: mine\nmounts: [{source: ~/.ssh/id_ed25519, target: /repo-key}]\n",
	})
	ws := filepath.Join(dir, "ws")
	p, err := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: ws}.Load("")
	if err != nil {
		t.Fatal(err)
	}
	granted, err := p.Grants(profile.GrantHost{Home: filepath.Join(dir, "home"), Workspace: ws, Resolve: fsutil.Resolve})
	if got := grantProblems(t, err, dir); !slices.Equal(got, []string{".propio/sandbox.yaml:2:19 mounts[1].source repo ssh"}) {
		t.Errorf("problems %q, want the repository's mount refused", got)
	}
	if len(granted) != 1 || granted[0].Name != "ssh" || granted[0].Field != "mounts[0].source" || granted[0].Pos.File != filepath.Join(dir, "cfg/mine.yaml") {
		t.Errorf("granted %+v, want the user profile's mount of ~/.ssh", granted)
	}
}

// TestReadmeCapabilities: the README's table of the capabilities that break
// isolation is DangerousCaps, row for row.
func TestReadmeCapabilities(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "| `") && strings.Count(line, "|") == 3 {
			rows = append(rows, line)
		}
	}
	start := slices.Index(rows, "| `"+profile.DangerousCaps[0].Name+"` | "+profile.DangerousCaps[0].Why+" |")
	if start < 0 {
		t.Fatalf("the README has no row for %s", profile.DangerousCaps[0].Name)
	}
	for i, c := range profile.DangerousCaps {
		want := "| `" + c.Name + "` | " + c.Why + " |"
		if start+i >= len(rows) || rows[start+i] != want {
			t.Errorf("README row %d of the capability table: want %q", i, want)
		}
	}
}

// TestGrantsBuildContext: a build context of HOME (or of ~/.ssh, ...) hands
// the build, and the image it makes, what a mount of it would hand the
// sandbox: the same grant, at build.context.
func TestGrantsBuildContext(t *testing.T) {
	t.Parallel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{
		"home/.ssh/id_ed25519": "key",
		"cfg/home.yaml":        "image: a\nbuild: {context: '${HOME}'}\n",
		"cfg/project.yaml":     "image: a\nbuild: {context: ~/project}\n",
	})
	host := profile.GrantHost{Home: filepath.Join(dir, "home"), Workspace: filepath.Join(dir, "ws"), Resolve: fsutil.Resolve}
	locs := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: host.Workspace, Host: &host}
	_, err = locs.Load("home")
	if got := grantProblems(t, err, dir); !slices.Equal(got, []string{"cfg/home.yaml:2:18 build.context unnamed home"}) {
		t.Errorf("a build context of HOME: %q", got)
	}
	if err != nil && !strings.Contains(err.Error(), "the build, and so the image it makes, sees all of it") {
		t.Errorf("the message does not say it is the build that sees it: %v", err)
	}
	if _, err := locs.Load("project"); err != nil {
		t.Errorf("a build context of a project below HOME: %v", err)
	}
	// A built-in's context is the install root, whatever it is.
	host.PropioHome = host.Home
	if _, err := locs.Load("offline"); err != nil {
		t.Errorf("a built-in with PROPIO_HOME at HOME: %v", err)
	}
}

// TestSystemWrite: an rw mount of a system directory, in one or holding
// one, is the unsafe grant system-write; read-only or changeset, it is
// not. A repository profile never makes it; a profile of the user's that
// names it in unsafe does.
func TestSystemWrite(t *testing.T) {
	t.Parallel()
	host := profile.GrantHost{} // paths as written: no host's links
	for source, want := range map[string]string{
		"/etc":                   "is a system directory",
		"/etc/cron.d":            "system directory /etc",
		"/usr/local/bin":         "system directory /usr",
		"/boot":                  "is a system directory",
		"/sbin/init":             "system directory /sbin",
		"/root":                  "is a system directory",
		"/var/lib/docker":        "is a system directory",
		"/var/lib/containers/st": "system directory /var/lib/containers",
		"/var":                   "holds the host's system directory /var/lib/docker",
		"/var/lib":               "holds the host's system directory /var/lib/docker",
		"/proc":                  "is a system directory",
		"/sys/fs/cgroup":         "system directory /sys",
		"/dev/kvm":               "system directory /dev",
		"/etc/../srv":            "",
		"/var/tmp":               "",
		"/srv/data":              "",
		"/":                      "", // host-root's
	} {
		ds := host.WriteDangers(source)
		switch {
		case want == "" && len(ds) > 0:
			t.Errorf("WriteDangers(%s) = %v, want none", source, ds)
		case want != "" && (len(ds) != 1 || ds[0].Name != profile.UnsafeSystemWrite || !strings.Contains(ds[0].What, want)):
			t.Errorf("WriteDangers(%s) = %v, want system-write saying %q", source, ds, want)
		}
	}

	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{
		"cfg/mine.yaml":           "image: a\nmounts: [{source: /usr/share, target: /s, mode: rw}]\nunsafe: [system-write]\n",
		"ws/.propio/sandbox.yaml": "extends: mine\nmounts:\n  - {source: /etc, target: /host-etc, mode: rw}\n  - {source: /var/lib/docker, target: /d, mode: rw, optional: true}\n  - {source: /etc, target: /etc-ro}\n  - {source: /etc, target: /etc-cs, mode: changeset}\n",
	})
	ws := filepath.Join(dir, "ws")
	p, err := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: ws}.Load("")
	if err != nil {
		t.Fatal(err)
	}
	granted, err := p.Grants(profile.GrantHost{Workspace: ws, Resolve: fsutil.Resolve})
	want := []string{".propio/sandbox.yaml:3:14 mounts[1].source repo system-write", ".propio/sandbox.yaml:4:14 mounts[2].source repo system-write"}
	if got := grantProblems(t, err, dir); !slices.Equal(got, want) {
		t.Errorf("problems %q, want %q", got, want)
	}
	if len(granted) != 1 || granted[0].Name != profile.UnsafeSystemWrite || granted[0].Field != "mounts[0].source" {
		t.Errorf("granted %+v, want the user profile's rw mount of /usr/share", granted)
	}
}
