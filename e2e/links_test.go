package e2e

// Workspace rules and links, attacked from inside real sandboxes: a rule
// whose path goes through a symbolic link mounts nothing of what the link
// points at, a hidden file's other names (a symbolic link to it, a hard link
// of it) read as empty too. The tests are named TestIsolationReadOnly... and
// TestIsolationHide... so that CI's Podman pass runs them as well.

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// linksOutside makes a host directory outside the workspace, named uniquely,
// holding a git config, a hook and a settings file that all carry secret.
func linksOutside(t *testing.T, secret string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "outside-"+randomID())
	isolationWriteFile(t, filepath.Join(dir, "config"), "[core]\n\tsshCommand = "+secret+"\n")
	isolationWriteFile(t, filepath.Join(dir, "hooks", "pre-commit"), "#!/bin/sh\necho "+secret+"\n")
	isolationWriteFile(t, filepath.Join(dir, "settings.json"), `{"token": "`+secret+`"}`)
	return dir
}

// linksUnreachable fails the test unless nothing under /workspace, read
// through every link, holds secret, and no mount of the sandbox comes from
// the outside directory.
func linksUnreachable(t *testing.T, s *sandbox, p, secret, outside string) {
	t.Helper()
	r := probeRun(s, p, "find", secret, "/workspace")
	if r.Code != 0 || !strings.Contains(r.Stdout, "searched ") || strings.Contains(r.Stdout, "found ") {
		t.Fatalf("the host's file is readable inside:\n%s", r)
	}
	r = probeRun(s, p, "read", "/proc/self/mountinfo")
	if r.Code != 0 || !strings.Contains(r.Stdout, " /workspace ") {
		t.Fatalf("reading the sandbox's mounts:\n%s", r)
	}
	if strings.Contains(r.Stdout, filepath.Base(outside)) {
		t.Fatalf("a mount comes from %s:\n%s", outside, r.Stdout)
	}
}

// linksWarned fails the test unless the launcher warned about rule (as
// field[i] at the profile's line) going through link.
func linksWarned(t *testing.T, r Result, field, profile string, line int, link, to, rule string) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^propio-sandbox: warning: ` + regexp.QuoteMeta(field) + ` \(` + regexp.QuoteMeta(profile) + `:` + strconv.Itoa(line) + `:[0-9]+\): ` +
		regexp.QuoteMeta(link+" is a symbolic link (to "+to+")") + `[^:]*: not followed, nothing mounted for ` + regexp.QuoteMeta(rule) + `$`)
	if !re.MatchString(r.Stderr) {
		t.Fatalf("want a warning matching %s:\n%s", re, r)
	}
}

// TestIsolationReadOnlyLinks: the symlinked .git across two runs. In the
// first, the agent tries to move .git away and put a link to a host
// directory in its place (the guard holds .git: it cannot); the link is then
// made on the host, as a launcher killed before its check could leave it; in
// the second run, the read-only rules .git/config and .git/hooks
// (and conf/settings.json, through a link the host already has) mount
// nothing of that directory: its files are not readable anywhere under
// /workspace, and the launcher says which rule it did not follow.
func TestIsolationReadOnlyLinks(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	secret := "e2e-outside-secret-" + randomID()
	outside := linksOutside(t, secret)
	isolationWriteFile(t, filepath.Join(s.Workspace, ".git", "config"), "[core]\n\tbare = false\n")
	isolationWriteFile(t, filepath.Join(s.Workspace, ".git", "hooks", "pre-commit.sample"), "#!/bin/sh\n")
	if err := os.Symlink(outside, filepath.Join(s.Workspace, "conf")); err != nil {
		t.Fatal(err)
	}
	p := s.Profile(probeOffline + "workspace:\n  readonly:\n    - .git/config\n    - .git/hooks\n    - conf/settings.json\n")

	// Run 1: conf is a link already; .git is real, and the agent tries to
	// swap it: the guard holds .git in place.
	r := probeRun(s, p, "fs", "mv .git .git-orig", "symlink "+outside+" .git")
	probeFails(t, r, "device or resource busy")
	linksWarned(t, r, "workspace.readonly[2]", p, 7, "conf", outside, "conf/settings.json")
	// What a sandbox of a launcher killed before its check could have left,
	// or what the user did: the swap made on the host.
	if err := os.Rename(filepath.Join(s.Workspace, ".git"), filepath.Join(s.Workspace, ".git-orig")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(s.Workspace, ".git")); err != nil {
		t.Fatal(err)
	}

	// Run 2: nothing of the outside directory is mounted or readable.
	r = probeRun(s, p, "read", ".git/config")
	probeFails(t, r, "no such file or directory")
	linksWarned(t, r, "workspace.readonly[0]", p, 5, ".git", outside, ".git/config")
	linksWarned(t, r, "workspace.readonly[1]", p, 6, ".git", outside, ".git/hooks")
	linksWarned(t, r, "workspace.readonly[2]", p, 7, "conf", outside, "conf/settings.json")
	probeFails(t, probeRun(s, p, "read", "conf/settings.json"), "no such file or directory")
	linksUnreachable(t, s, p, secret, outside)
	isolationHasContent(t, filepath.Join(outside, "config"), "[core]\n\tsshCommand = "+secret+"\n")
}

// TestIsolationHideLinks: a hide rule through a symbolic link to a host
// directory mounts nothing of it, with a warning; a hide rule on a link
// whose target is in the workspace hides the target too, since inside the
// link reads it.
func TestIsolationHideLinks(t *testing.T) {
	t.Parallel()
	t.Run("through-a-linked-directory", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		secret := "e2e-outside-secret-" + randomID()
		outside := linksOutside(t, secret)
		if err := os.Symlink(outside, filepath.Join(s.Workspace, "conf")); err != nil {
			t.Fatal(err)
		}
		p := s.Profile(probeOffline + "workspace:\n  hide:\n    - conf/settings.json\n")
		r := probeRun(s, p, "read", "conf/settings.json")
		probeFails(t, r, "no such file or directory")
		linksWarned(t, r, "workspace.hide[0]", p, 5, "conf", outside, "conf/settings.json")
		linksUnreachable(t, s, p, secret, outside)
	})
	t.Run("a-link-to-a-workspace-file", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		secret := "TOKEN=e2e-prod-" + randomID() + "\n"
		prod := filepath.Join(s.Workspace, "real", "prod.env")
		isolationWriteFile(t, prod, secret)
		if err := os.Symlink("real/prod.env", filepath.Join(s.Workspace, ".env")); err != nil {
			t.Fatal(err)
		}
		// An absolute link: in the sandbox, /workspace/real/prod.env is
		// that file too.
		if err := os.Symlink("/workspace/real/prod.env", filepath.Join(s.Workspace, ".env.local")); err != nil {
			t.Fatal(err)
		}
		p := s.Profile(probeOffline + "workspace:\n  hide: [.env, .env.local]\n")
		for _, path := range []string{".env", ".env.local", "real/prod.env"} {
			r := probeRun(s, p, "read", path)
			if r.Code != 0 || r.Stdout != "" || r.OwnStderr() != "" {
				t.Fatalf("want %s to read as empty, with no warning:\n%s", path, r)
			}
		}
		probeFails(t, probeRun(s, p, "write", "real/prod.env", "overwritten"), "read-only file system")
		probeFails(t, probeRun(s, p, "write", ".env", "overwritten"), "read-only file system")
		r := probeRun(s, p, "find", strings.TrimSpace(secret), "/workspace")
		if r.Code != 0 || strings.Contains(r.Stdout, "found ") {
			t.Fatalf("the hidden file is readable inside:\n%s", r)
		}
		isolationHasContent(t, prod, secret)
	})
}

// TestIsolationHideOtherNames: other names (hard links) that a hidden file
// has when the sandbox starts read as empty too, as do those of a file
// below a hidden directory; the host's files keep their content and names.
func TestIsolationHideOtherNames(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	envSecret := "API_KEY=e2e-hardlinked-" + randomID() + "\n"
	vaultSecret := "e2e-vault-token-" + randomID() + "\n"
	env := filepath.Join(s.Workspace, ".env")
	token := filepath.Join(s.Workspace, "vault", "token")
	isolationWriteFile(t, env, envSecret)
	isolationWriteFile(t, token, vaultSecret)
	notes := filepath.Join(s.Workspace, "notes.txt")
	backup := filepath.Join(s.Workspace, "backup", "token.txt")
	if err := os.Link(env, notes); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(backup), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(token, backup); err != nil {
		t.Fatal(err)
	}
	p := s.Profile(probeOffline + "workspace:\n  hide: [.env, vault]\n")

	for _, path := range []string{".env", "notes.txt", "backup/token.txt"} {
		r := probeRun(s, p, "read", path)
		if r.Code != 0 || r.Stdout != "" {
			t.Fatalf("want %s to read as empty:\n%s", path, r)
		}
		probeFails(t, probeRun(s, p, "write", path, "overwritten"), "read-only file system")
		// Appending is refused as well, by the mask's mode or its mount.
		if r := probeRun(s, p, "fs", "append "+path+" more"); r.Code != 1 || !regexp.MustCompile(`error: .*(read-only file system|permission denied)`).MatchString(r.Stdout) {
			t.Fatalf("want appending to %s refused:\n%s", path, r)
		}
	}
	probeFails(t, probeRun(s, p, "read", "vault/token"), "no such file or directory")
	for _, secret := range []string{envSecret, vaultSecret} {
		r := probeRun(s, p, "find", strings.TrimSpace(secret), "/workspace")
		if r.Code != 0 || strings.Contains(r.Stdout, "found ") {
			t.Fatalf("a hidden file is readable inside:\n%s", r)
		}
	}
	// A file that is not hidden keeps being readable and writable.
	probeOK(t, probeRun(s, p, "write", "other.txt", "x"), "wrote")

	isolationHasContent(t, notes, envSecret)
	isolationHasContent(t, backup, vaultSecret)
	for _, f := range []string{env, notes, token, backup} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := fi.Sys().(*syscall.Stat_t).Nlink; n != 2 {
			t.Errorf("%s has %d names on the host, want 2", f, n)
		}
	}
}
