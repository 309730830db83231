package e2e

// Grants that undo the sandbox (unsafe): a repository profile can never make
// them, whatever it says, and every command refuses it before anything is
// created; a user profile makes them only by naming each in unsafe, and then
// the sandbox really has what was granted, and run, render and trust say so.

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// unsafeSecret sets a secret in the launcher's environment, as a user's
// shell has them, and returns its value.
func unsafeSecret(s *sandbox) string {
	v := "e2e-secret-" + randomID()
	s.Env = append(s.Env, "AWS_SECRET_ACCESS_KEY="+v)
	return v
}

// unsafeEngineLink makes ~/engine-link, a link to the engine's socket: the
// socket by another path.
func unsafeEngineLink(t *testing.T, s *sandbox) {
	t.Helper()
	if err := os.Symlink(engineSocket(t), filepath.Join(s.Home, "engine-link")); err != nil {
		t.Fatal(err)
	}
}

// unsafeKeys makes ~/.ssh with a private key in it.
func unsafeKeys(t *testing.T, s *sandbox) {
	t.Helper()
	isolationWriteFile(t, filepath.Join(s.Home, ".ssh", "id_ed25519"), "-----BEGIN OPENSSH PRIVATE KEY-----\ne2e\n")
}

// TestUnsafeGrantRefusedInRepository: a checked-in profile that mounts the
// engine's socket (by a link), /, HOME or ~/.ssh, or /etc or
// /var/lib/docker rw, adds SYS_ADMIN or passes '*_*' is refused by run, trust, render and doctor at the grant's
// FILE:LINE:COL, before anything is created or trusted, even though it names
// the grant in unsafe; a secret of the launcher's environment appears in no
// output.
func TestUnsafeGrantRefusedInRepository(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(*testing.T, *sandbox)
		line  string // line 3 of the profile
		at    string // where the refusal points
		grant string
	}{
		{"engine socket by a link", unsafeEngineLink, "mounts: [{source: ~/engine-link, target: /engine.sock}]", "3:19: mounts[0].source", "docker-socket"},
		{"root", nil, "mounts: [{source: /, target: /host}]", "3:19: mounts[0].source", "host-root"},
		{"home", nil, "mounts: [{source: '~', target: /host-home}]", "3:19: mounts[0].source", "home"},
		{"ssh", unsafeKeys, "mounts: [{source: ~/.ssh, target: /keys}]", "3:19: mounts[0].source", "ssh"},
		{"SYS_ADMIN", nil, "security: {cap_add: [SYS_ADMIN]}", "3:22: security.cap_add[0]", "SYS_ADMIN"},
		{"env glob", nil, "env: {pass: ['*_*']}", "3:14: env.pass[0]", "env-glob"},
		{"/etc rw", nil, "mounts: [{source: /etc, target: /host-etc, mode: rw}]", "3:19: mounts[0].source", "system-write"},
		{"/var/lib/docker rw", nil, "mounts: [{source: /var/lib/docker, target: /d, mode: rw}]", "3:19: mounts[0].source", "system-write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSandbox(t)
			secret := unsafeSecret(s)
			if tc.setup != nil {
				tc.setup(t, s)
			}
			isolationWriteFile(t, filepath.Join(s.Workspace, ".propio", "sandbox.yaml"),
				"image: "+ProbeImage+"\nnetwork: {mode: none}\n"+tc.line+"\nunsafe: ["+tc.grant+"]\n")
			want := ".propio/sandbox.yaml:" + tc.at + ": unsafe grant " + tc.grant + " in a repository profile: "
			for _, args := range [][]string{{"run", "--", "env", "AWS_SECRET_ACCESS_KEY"}, {"trust"}, {"render"}, {"doctor"}} {
				r := s.Run("", args...)
				errorsCheck(t, r, 1, []string{want, ".propio/sandbox.yaml:4:1: unsafe: a repository profile cannot name unsafe grants"}, []string{"a repository profile can never grant " + tc.grant})
				if strings.Contains(r.Stdout+r.Stderr, secret) {
					t.Errorf("%v: the secret's value is in the output:\n%s", args, r)
				}
				if left := s.Leftovers(); len(left) > 0 {
					t.Errorf("%v: a refused profile left %v", args, left)
				}
			}
			if _, err := os.Stat(filepath.Join(s.Home, ".local", "state", "propio-sandbox", "trusted.json")); err == nil {
				t.Errorf("trust recorded a profile it refused")
			}
		})
	}
}

// unsafeWarned fails the test unless stderr warns about the grant name at
// field of the profile file p.
func unsafeWarned(t *testing.T, what string, r Result, name, field, p string) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^propio-sandbox: warning: unsafe grant ` + regexp.QuoteMeta(name) + `: ` + regexp.QuoteMeta(field) + ` \(` + regexp.QuoteMeta(p) + `:\d+:\d+\): `)
	if !re.MatchString(r.Stderr) {
		t.Errorf("%s: no warning about %s at %s (%s):\n%s", what, name, field, p, r)
	}
}

// TestUnsafeGrantGranted: a user profile that names its grants in unsafe
// runs, and the sandbox really has them (it reaches the engine's API through
// the socket it was given by a link, sees the secret '*_*' passes, reads the
// key of ~/.ssh, has SYS_ADMIN as root); run, render and trust each warn
// about every grant, naming it, its field and position.
func TestUnsafeGrantGranted(t *testing.T) {
	t.Parallel()
	t.Run("engine socket", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		unsafeEngineLink(t, s)
		p := s.Profile(probeOffline + "mounts: [{source: ~/engine-link, target: /engine.sock}]\nunsafe: [docker-socket]\n")
		r := probeRun(s, p, "unixget", "/engine.sock", "/version")
		probeOK(t, r, "status 200")
		if !strings.Contains(r.Stdout, `"ApiVersion"`) {
			t.Errorf("the engine's /version has no ApiVersion:\n%s", r)
		}
		unsafeWarned(t, "run", r, "docker-socket", "mounts[0].source", p)
		unsafeWarnedAll(t, s, p, "docker-socket", "mounts[0].source")
	})
	t.Run("env glob", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		secret := unsafeSecret(s)
		p := s.Profile(probeOffline + "env: {pass: ['*_*']}\nunsafe: [env-glob]\n")
		r := probeRun(s, p, "env", "AWS_SECRET_ACCESS_KEY")
		probeOK(t, r, "AWS_SECRET_ACCESS_KEY="+secret)
		unsafeWarned(t, "run", r, "env-glob", "env.pass[0]", p)
		rendered := unsafeWarnedAll(t, s, p, "env-glob", "env.pass[0]")
		if strings.Contains(rendered, secret) {
			t.Errorf("render shows the secret's value:\n%s", rendered)
		}
	})
	t.Run("ssh", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		unsafeKeys(t, s)
		p := s.Profile(probeOffline + "mounts: [{source: ~/.ssh, target: /keys}]\nunsafe: [ssh]\n")
		r := probeRun(s, p, "read", "/keys/id_ed25519")
		probeOK(t, r, "OPENSSH PRIVATE KEY")
		unsafeWarned(t, "run", r, "ssh", "mounts[0].source", p)
		unsafeWarnedAll(t, s, p, "ssh", "mounts[0].source")
	})
	t.Run("SYS_ADMIN as root", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile(probeOffline + "user: root\nsecurity: {cap_add: [SYS_ADMIN]}\nunsafe: [SYS_ADMIN, root-user]\n")
		r := probeRun(s, p, "read", "/proc/self/status")
		probeOK(t, r, "CapEff:")
		m := regexp.MustCompile(`(?m)^CapEff:\s*([0-9a-f]+)$`).FindStringSubmatch(r.Stdout)
		if m == nil {
			t.Fatalf("no CapEff in /proc/self/status:\n%s", r)
		}
		const capSysAdmin = 21
		if eff, err := strconv.ParseUint(m[1], 16, 64); err != nil || eff&(1<<capSysAdmin) == 0 {
			t.Errorf("CapEff %s lacks SYS_ADMIN", m[1])
		}
		for _, g := range []struct{ name, field string }{{"root-user", "user"}, {"SYS_ADMIN", "security.cap_add[0]"}} {
			unsafeWarned(t, "run", r, g.name, g.field, p)
			unsafeWarnedAll(t, s, p, g.name, g.field)
		}
	})
	t.Run("PROPIO_SANDBOX_MOUNTS", func(t *testing.T) {
		t.Parallel()
		// The user's own choice for one launch: not refused, but warned about.
		s := newSandbox(t)
		unsafeKeys(t, s)
		s.Env = append(s.Env, "PROPIO_SANDBOX_MOUNTS="+filepath.Join(s.Home, ".ssh")+":/keys:ro")
		r := probeRun(s, s.Profile(probeOffline), "read", "/keys/id_ed25519")
		probeOK(t, r, "OPENSSH PRIVATE KEY")
		if !strings.Contains(r.Stderr, "propio-sandbox: warning: unsafe grant ssh: PROPIO_SANDBOX_MOUNTS mounts "+filepath.Join(s.Home, ".ssh")+" at /keys: ") {
			t.Errorf("no warning about the mount of ~/.ssh:\n%s", r)
		}
	})
}

// unsafeWarnedAll checks that render and trust warn about the grant too, and
// returns what render printed.
func unsafeWarnedAll(t *testing.T, s *sandbox, p, name, field string) string {
	t.Helper()
	r := s.Run("", "render", "-p", p)
	if r.Code != 0 {
		t.Fatalf("render:\n%s", r)
	}
	unsafeWarned(t, "render", r, name, field, p)
	rendered := r.Stdout
	r = s.Run("", "trust", "-p", p)
	if r.Code != 0 || !strings.Contains(r.Stdout, "needs no trust") {
		t.Fatalf("trust of a user profile:\n%s", r)
	}
	unsafeWarned(t, "trust", r, name, field, p)
	return rendered
}

// TestTrustWarnsWritesOutside: trust shows a repository profile's rw mount
// outside the workspace as a warning (one inside it is not), and the
// warning is true: once trusted, the sandbox writes that host path itself.
func TestTrustWarnsWritesOutside(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	notes := filepath.Join(s.Home, "notes")
	isolationWriteFile(t, filepath.Join(notes, ".keep"), "")
	isolationWriteFile(t, filepath.Join(s.Workspace, ".propio", "sandbox.yaml"),
		"image: "+ProbeImage+"\nnetwork: {mode: none}\nmounts:\n  - {source: ~/notes, target: /notes, mode: rw}\n  - {source: '${WORKSPACE}/cache', target: /cache, mode: rw, optional: true}\n")
	r := s.Run("", "trust")
	want := "propio-sandbox: warning: mounts[0].source (.propio/sandbox.yaml:4:14): " + notes + " is mounted rw, outside the workspace: the sandbox writes it on the host, with no changeset to review\n"
	if r.Code != 0 || !strings.Contains(r.Stderr, want) || strings.Contains(r.Stderr, "mounts[1]") {
		t.Fatalf("trust: want the warning %q, and none for the mount in the workspace:\n%s", want, r)
	}
	probeOK(t, s.Run("", "run", "--", "write", "/notes/from-the-sandbox", "written"), "")
	if b, err := os.ReadFile(filepath.Join(notes, "from-the-sandbox")); err != nil || string(b) != "written" {
		t.Errorf("the sandbox's write is not on the host: %q, %v", b, err)
	}
}
