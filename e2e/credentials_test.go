package e2e

// What of the user's git and SSH setup a sandbox gets: exactly what the
// profile (or PROPIO_SANDBOX_SSH_AGENT, PROPIO_SANDBOX_MOUNTS) opts into.
// The sandbox runs the agent image (git, ssh) as the launcher's user; the
// test's HOME stands in for the user's.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// TestGitIdentity: with git.config, a commit inside uses the host's git
// identity; ~/.git-credentials never comes along; without git.config,
// nothing of the configuration does.
func TestGitIdentity(t *testing.T) {
	s := newSandbox(t)
	requireAgentImage(t)
	writeFile(t, filepath.Join(s.Home, ".gitconfig"), []byte("[user]\n\tname = Host User\n\temail = host@example.test\n[core]\n\texcludesFile = ~/.gitignore_global\n"), 0o644)
	writeFile(t, filepath.Join(s.Home, ".gitignore_global"), []byte("*.secret-ignored\n"), 0o644)
	writeFile(t, filepath.Join(s.Home, ".git-credentials"), []byte("https://user:token-never-shared@git.example.test\n"), 0o600)
	script := `set -e
echo "discovery=$GIT_DISCOVERY_ACROSS_FILESYSTEM"
git init -q repo && cd repo
touch a.secret-ignored b.txt
echo "untracked=$(git status --porcelain | tr '\n' ' ')"
git add -A && git commit -q -m first
git log -1 --format='author=%an <%ae>'
for f in ~/.git-credentials "$HOST_HOME/.git-credentials"; do test -e "$f" && echo "visible: $f" || true; done
echo done`

	t.Run("git.config", func(t *testing.T) {
		p := s.Profile("image: " + agentImage + "\ngit: {config: true}\nenv: {set: {HOST_HOME: " + s.Home + "}}\n")
		r := s.Run("", "run", "-p", p, "--", "bash", "-c", script)
		if r.Code != 0 {
			t.Fatalf("run:\n%s", r)
		}
		for _, want := range []string{"discovery=1", "untracked=?? b.txt ", "author=Host User <host@example.test>", "done"} {
			if !strings.Contains(r.Stdout, want) {
				t.Errorf("want %q in:\n%s", want, r)
			}
		}
		if strings.Contains(r.Stdout, "visible:") || strings.Contains(r.Stdout+r.Stderr, "token-never-shared") {
			t.Errorf("~/.git-credentials reached the sandbox:\n%s", r)
		}
	})
	t.Run("without git.config", func(t *testing.T) {
		p := s.Profile("image: " + agentImage + "\n")
		r := s.Run("", "run", "-p", p, "--", "bash", "-c", "git config --global user.name || echo no-identity; ls -a ~")
		if r.Code != 0 || !strings.Contains(r.Stdout, "no-identity") || strings.Contains(r.Stdout, ".gitconfig") {
			t.Errorf("the git configuration came along without git.config:\n%s", r)
		}
	})
	t.Run("an existing file only", func(t *testing.T) {
		// No ~/.config/git/config here: the launch goes on without it.
		p := s.Profile("image: " + agentImage + "\ngit: {config: true}\n")
		r := s.Run("", "run", "-p", p, "--", "bash", "-c", "test -e ~/.config/git/config && echo has-xdg || echo no-xdg")
		if r.Code != 0 || !strings.Contains(r.Stdout, "no-xdg") {
			t.Errorf("run:\n%s", r)
		}
	})
}

// TestSSHAgentForwarding: git ls-remote over SSH to the test's server, with
// the test's own SSH agent as the user's: it succeeds with forwarding on and
// fails with it off. The sandbox reaches the server through an allowlist
// gateway (a git.test:22 rule, forwarded as TCP), and checks the server's
// host key against the user's known_hosts, which comes along read-only.
func TestSSHAgentForwarding(t *testing.T) {
	s := newSandbox(t)
	requireAgentImage(t)
	priv, sshPub := testKey(t)
	// The sandbox goes through an allowlist gateway, on Docker and Podman.
	host, netYAML := sshServerAlias, "network:\n  mode: allowlist\n  allow: [\""+sshServerAlias+":22\"]\n"
	in := newInternet(t)
	srv := startSSHServer(t, in.Network, sshPub)
	s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
	if err := os.MkdirAll(filepath.Join(s.Home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(s.Home, ".ssh", "known_hosts"), []byte(srv.HostKeyLine+"\n"), 0o644)
	sock := startSSHAgent(t, priv)
	s.Env = append(s.Env, "SSH_AUTH_SOCK="+sock)
	// With the agent, the host key is checked against the user's
	// known_hosts (which comes along); without it there is no known_hosts,
	// so the key is accepted, and what fails is the authentication.
	profile := func(mode string) string {
		check := "-o StrictHostKeyChecking=yes"
		if mode == "off" {
			check = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
		}
		return s.Profile("image: " + agentImage + "\nssh_agent: " + mode + "\n" + netYAML +
			"env:\n  set: {GIT_SSH_COMMAND: \"ssh -o BatchMode=yes " + check + "\"}\n")
	}
	lsRemote := []string{"--", "bash", "-c", "echo sock=${SSH_AUTH_SOCK:-unset}; git ls-remote ssh://git@" + host + "/srv/repo.git"}

	t.Run("on", func(t *testing.T) {
		r := s.Run("", append([]string{"run", "-p", profile("on")}, lsRemote...)...)
		if r.Code != 0 || !strings.Contains(r.Stdout, "sock=/ssh-agent") || !strings.Contains(r.Stdout, "refs/heads/main") {
			t.Fatalf("git ls-remote with the agent forwarded:\n%s\nserver:\n%s", r, srv.Logs(t))
		}
		if !strings.Contains(srv.Logs(t), "auth publickey git ok "+ssh.FingerprintSHA256(sshPub)) {
			t.Errorf("the server did not see the agent's key:\n%s", srv.Logs(t))
		}
	})
	t.Run("auto with SSH_AUTH_SOCK set", func(t *testing.T) {
		r := s.Run("", append([]string{"run", "-p", profile("auto")}, lsRemote...)...)
		if r.Code != 0 || !strings.Contains(r.Stdout, "refs/heads/main") {
			t.Fatalf("git ls-remote under auto:\n%s", r)
		}
	})
	t.Run("off", func(t *testing.T) {
		r := s.Run("", append([]string{"run", "-p", profile("off")}, lsRemote...)...)
		if r.Code == 0 || !strings.Contains(r.Stdout, "sock=unset") || !strings.Contains(r.Stderr, "Permission denied (publickey)") {
			t.Fatalf("git ls-remote without forwarding should fail for want of a key:\n%s", r)
		}
	})
	t.Run("the environment overrides the profile", func(t *testing.T) {
		env := s.Env
		defer func() { s.Env = env }()
		s.Env = append(append([]string(nil), env...), "PROPIO_SANDBOX_SSH_AGENT=off")
		r := s.Run("", append([]string{"run", "-p", profile("on")}, lsRemote...)...)
		if r.Code == 0 || !strings.Contains(r.Stdout, "sock=unset") {
			t.Fatalf("PROPIO_SANDBOX_SSH_AGENT=off did not stop forwarding:\n%s", r)
		}
		s.Env = append(append([]string(nil), env...), "SANDBOX_SSH_AGENT=on")
		r = s.Run("", append([]string{"run", "-p", profile("off")}, lsRemote...)...)
		if r.Code != 0 || !strings.Contains(r.Stdout, "refs/heads/main") {
			t.Fatalf("SANDBOX_SSH_AGENT=on did not forward:\n%s", r)
		}
	})
	t.Run("auto without an agent warns and goes on", func(t *testing.T) {
		env := s.Env
		defer func() { s.Env = env }()
		s.Env = nil
		for _, kv := range env {
			if !strings.HasPrefix(kv, "SSH_AUTH_SOCK=") {
				s.Env = append(s.Env, kv)
			}
		}
		r := s.Run("", "run", "-p", profile("auto"), "--", "bash", "-c", "echo sock=${SSH_AUTH_SOCK:-unset}")
		if r.Code != 0 || !strings.Contains(r.Stdout, "sock=unset") || !strings.Contains(r.Stderr, "warning") || !strings.Contains(r.Stderr, "SSH_AUTH_SOCK") {
			t.Fatalf("want a warning about SSH_AUTH_SOCK and a run without forwarding:\n%s", r)
		}
		r = s.Run("", "run", "-p", profile("on"), "--", "true")
		if r.Code != 3 || !strings.Contains(r.Stderr, "preflight check ssh-agent failed") || !strings.Contains(r.Stderr, "SSH_AUTH_SOCK") || len(s.Leftovers()) > 0 {
			t.Fatalf("ssh_agent on without an agent must stop before anything is created:\n%s\nleft: %v", r, s.Leftovers())
		}
	})
}

// TestExtraMounts: PROPIO_SANDBOX_MOUNTS adds mounts for one launch,
// read-only unless :rw; a relative or missing source stops the launch.
func TestExtraMounts(t *testing.T) {
	s := newSandbox(t)
	ro, rw := filepath.Join(s.Home, "extra-ro"), filepath.Join(s.Home, "extra-rw")
	for _, d := range []string{ro, rw} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o777)
	}
	writeFile(t, filepath.Join(ro, "token"), []byte("opted-in\n"), 0o644)
	p := s.Profile("network: {mode: none}\n")
	env := s.Env
	s.Env = append(append([]string(nil), env...), "PROPIO_SANDBOX_MOUNTS="+ro+":/extra/ro,"+rw+":/extra/rw:rw")
	if r := s.Run("", "run", "-p", p, "--", "read", "/extra/ro/token"); r.Code != 0 || !strings.Contains(r.Stdout, "opted-in") {
		t.Errorf("reading an extra mount:\n%s", r)
	}
	if r := s.Run("", "run", "-p", p, "--", "write", "/extra/ro/new", "x"); r.Code == 0 || !strings.Contains(r.Stdout, "read-only file system") {
		t.Errorf("an extra mount without :rw must be read-only:\n%s", r)
	}
	if r := s.Run("", "run", "-p", p, "--", "write", "/extra/rw/new", "x"); r.Code != 0 {
		t.Errorf("writing an extra mount with :rw:\n%s", r)
	} else if _, err := os.Stat(filepath.Join(rw, "new")); err != nil {
		t.Errorf("the write did not reach the host: %v", err)
	}
	s.Env = append(append([]string(nil), env...), "SANDBOX_MOUNTS=relative/dir:/x,"+filepath.Join(s.Home, "missing")+":/y")
	r := s.Run("", "run", "-p", p, "--", "id")
	if r.Code != 1 || !strings.Contains(r.Stderr, `"relative/dir:/x": the source is relative`) || !strings.Contains(r.Stderr, "does not exist") {
		t.Errorf("bad extra mounts must stop the launch, naming each:\n%s", r)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	s.Env = env
}
