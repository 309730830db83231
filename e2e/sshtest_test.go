package e2e

// A git host over SSH and an SSH agent, both started by the test itself, for
// the tests of SSH agent forwarding: the server is `probe sshd` run in the
// agent image (which has git), the agent is in-process.

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// agentImage is the default sandbox image; the SSH tests need its git and ssh.
const agentImage = "propio-sandbox/agent:latest"

// sshServerAlias is the SSH server's name on its network.
const sshServerAlias = "git.test"

// sshServer is a running `probe sshd` container serving the bare repository
// /srv/repo.git (one commit on main).
type sshServer struct {
	Container string // the container's name
	IP        string // its address on Network
	Network   string
	// HostKeyLine is a known_hosts line for the server, naming both its
	// alias and its address: "git.test,<ip> ssh-ed25519 AAAA...".
	HostKeyLine string
}

// requireAgentImage skips t when the agent image is missing, or fails it
// when PROPIO_E2E=require.
func requireAgentImage(t *testing.T) {
	t.Helper()
	if out, err := docker("image", "inspect", agentImage); err != nil {
		dockerfileSkipOrFail(t, "the agent image is missing (build it with `propio-sandbox build`, as .ci/run does): %v %s", err, firstLine(out))
	}
}

// startSSHServer runs an SSH server in the agent image on network, with the
// alias git.test, letting in only authorized (as any user). It is removed
// in cleanup.
func startSSHServer(t *testing.T, network string, authorized ssh.PublicKey) *sshServer {
	t.Helper()
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(hostPriv, "")
	if err != nil {
		t.Fatal(err)
	}
	hostSigner, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	keys := t.TempDir()
	writeFile(t, filepath.Join(keys, "host_key"), pem.EncodeToMemory(block), 0o644)
	writeFile(t, filepath.Join(keys, "authorized_keys"), ssh.MarshalAuthorizedKey(authorized), 0o644)

	s := &sshServer{Container: "propio-e2e-sshd-" + randomID(), Network: network}
	args := []string{"run", "-d", "--name", s.Container, "--label", "dev.propio-sandbox.e2e=1",
		"--network", network, "--user", "0:0",
		// The repository's files may belong to another uid than the server's.
		"-e", "GIT_CONFIG_COUNT=1", "-e", "GIT_CONFIG_KEY_0=safe.directory", "-e", "GIT_CONFIG_VALUE_0=*",
		"-v", testenv.ProbeBinary(t) + ":/probe:ro", "-v", keys + ":/keys:ro"}
	if network != "bridge" { // the default network has no aliases
		args = append(args, "--network-alias", sshServerAlias)
	}
	_, gitErr := exec.LookPath("git")
	if gitErr == nil {
		args = append(args, "-v", makeBareRepo(t)+":/srv/repo.git")
	}
	args = append(args, "--entrypoint", "/probe", agentImage,
		"sshd", "--host-key", "/keys/host_key", "--authorized-keys", "/keys/authorized_keys")
	if _, err := docker(args...); err != nil {
		t.Fatalf("starting the SSH server: %v", err)
	}
	t.Cleanup(func() { docker("rm", "-f", s.Container) })
	s.waitListening(t)

	if gitErr != nil {
		// No git here: make the repository in the container.
		script := `set -e
export HOME=/tmp/gitsetup GIT_CONFIG_NOSYSTEM=1
git -c init.defaultBranch=main init -q --bare /srv/repo.git
git init -q /tmp/gitsetup/work
cd /tmp/gitsetup/work
git -c user.name=e2e -c user.email=e2e@example.invalid commit -q --allow-empty -m init
git push -q /srv/repo.git HEAD:refs/heads/main`
		if _, err := docker("exec", "--user", "0:0", s.Container, "sh", "-c", script); err != nil {
			t.Fatalf("making the repository in the SSH server: %v", err)
		}
	}

	ip, err := docker("inspect", "--format", `{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}`, s.Container)
	if err != nil {
		t.Fatal(err)
	}
	s.IP = strings.TrimSpace(ip)
	if net.ParseIP(s.IP) == nil {
		t.Fatalf("the SSH server's address on %s: %q", network, s.IP)
	}
	s.HostKeyLine = knownhosts.Line([]string{sshServerAlias, s.IP}, hostSigner.PublicKey())
	return s
}

// waitListening waits up to 30s for the server to print "sshd listening".
func (s *sshServer) waitListening(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		logs, _ := docker("logs", s.Container)
		if strings.Contains(logs, "sshd listening") {
			return
		}
		if running, _ := docker("inspect", "--format", "{{.State.Running}}", s.Container); strings.TrimSpace(running) == "false" {
			t.Fatalf("the SSH server exited:\n%s", logs)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the SSH server did not print \"sshd listening\" in 30s:\n%s", logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Logs is what the server printed so far.
func (s *sshServer) Logs(t *testing.T) string {
	t.Helper()
	logs, err := docker("logs", s.Container)
	if err != nil {
		t.Fatal(err)
	}
	return logs
}

// makeBareRepo makes a bare repository with one commit on main with the
// host's git, none of the user's configuration applying, and returns its
// path.
func makeBareRepo(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	home, repo, work := filepath.Join(base, "home"), filepath.Join(base, "repo.git"), filepath.Join(base, "work")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=e2e", "GIT_AUTHOR_EMAIL=e2e@example.invalid",
		"GIT_COMMITTER_NAME=e2e", "GIT_COMMITTER_EMAIL=e2e@example.invalid",
	}
	git := func(dir string, args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	git(base, "-c", "init.defaultBranch=main", "init", "-q", "--bare", repo)
	git(base, "clone", "-q", repo, work)
	git(work, "commit", "-q", "--allow-empty", "-m", "init")
	git(work, "push", "-q", "origin", "HEAD:refs/heads/main")
	// The server may run as another uid than this test: let it read.
	filepath.WalkDir(repo, func(path string, d os.DirEntry, err error) error {
		if err == nil {
			if d.IsDir() {
				os.Chmod(path, 0o755)
			} else {
				os.Chmod(path, 0o644)
			}
		}
		return nil
	})
	return repo
}

// startSSHAgent serves an in-process SSH agent holding keys on a unix socket
// any uid may connect to, and returns the socket's path. It stops in
// cleanup.
func startSSHAgent(t *testing.T, keys ...ed25519.PrivateKey) string {
	t.Helper()
	keyring := agent.NewKeyring()
	for _, k := range keys {
		if err := keyring.Add(agent.AddedKey{PrivateKey: k}); err != nil {
			t.Fatal(err)
		}
	}
	// Under /tmp, not $TMPDIR, so the path fits in sun_path (108 bytes).
	dir, err := os.MkdirTemp("/tmp", "ag")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	if err := errors.Join(os.Chmod(dir, 0o755), os.Chmod(sock, 0o777)); err != nil {
		ln.Close()
		os.RemoveAll(dir)
		t.Fatal(err)
	}

	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				agent.ServeAgent(keyring, c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
		os.RemoveAll(dir)
	})
	return sock
}

// testKey makes an ed25519 key pair: the private key for an agent, the
// public one for a server's authorized keys.
func testKey(t *testing.T) (ed25519.PrivateKey, ssh.PublicKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return priv, sshPub
}

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

// TestSSHServerWithAgent proves the SSH test pieces work together without
// propio-sandbox: git ls-remote over SSH, from the agent image, succeeds with
// the agent holding the authorized key, and fails with no agent or with an
// agent holding another key. The client runs as root: ssh needs a passwd
// entry for its uid, and the image has one for root.
func TestSSHServerWithAgent(t *testing.T) {
	requireEngine(t)
	requireAgentImage(t)

	network := "propio-e2e-ssh-" + randomID()
	if _, err := docker("network", "create", "--label", "dev.propio-sandbox.e2e=1", network); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.RemoveNetwork(t, network) })

	priv, sshPub := testKey(t)
	_, otherPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherSigner, err := ssh.NewSignerFromKey(otherPriv)
	if err != nil {
		t.Fatal(err)
	}

	srv := startSSHServer(t, network, sshPub)
	knownHosts := filepath.Join(t.TempDir(), "known_hosts")
	writeFile(t, knownHosts, []byte(srv.HostKeyLine+"\n"), 0o644)

	lsRemote := func(agentSock string) (string, error) {
		t.Helper()
		args := []string{"run", "--rm", "--label", "dev.propio-sandbox.e2e=1", "--network", network,
			"--user", "0:0", "-v", knownHosts + ":/kh:ro",
			"-e", "GIT_SSH_COMMAND=ssh -o UserKnownHostsFile=/kh -o StrictHostKeyChecking=yes -o BatchMode=yes"}
		if agentSock != "" {
			args = append(args, "-v", agentSock+":/ssh-agent", "-e", "SSH_AUTH_SOCK=/ssh-agent")
		}
		args = append(args, agentImage, "git", "ls-remote", "ssh://git@"+sshServerAlias+"/srv/repo.git")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return dockerfileDocker(ctx, args...)
	}

	t.Run("agent with the authorized key", func(t *testing.T) {
		out, err := lsRemote(startSSHAgent(t, priv))
		if err != nil {
			t.Fatalf("git ls-remote: %v\n%s\nserver:\n%s", err, out, srv.Logs(t))
		}
		if !strings.Contains(out, "\trefs/heads/main\n") && !strings.Contains(out, "\trefs/heads/master\n") {
			t.Fatalf("git ls-remote printed no branch:\n%s", out)
		}
		t.Logf("git ls-remote:\n%s", out)
		logs := srv.Logs(t)
		for _, want := range []string{
			"auth publickey git ok " + ssh.FingerprintSHA256(sshPub),
			"exec git-upload-pack '/srv/repo.git'",
		} {
			if !strings.Contains(logs, want) {
				t.Errorf("server log lacks %q:\n%s", want, logs)
			}
		}
	})
	t.Run("no agent", func(t *testing.T) {
		out, err := lsRemote("")
		if err == nil {
			t.Fatalf("git ls-remote succeeded without an agent:\n%s", out)
		}
		if !strings.Contains(out, "Permission denied (publickey)") {
			t.Fatalf("git ls-remote failed, but not for want of a key: %v\n%s", err, out)
		}
		t.Logf("git ls-remote failed as it should: %v\n%s", err, out)
	})
	t.Run("agent with another key", func(t *testing.T) {
		out, err := lsRemote(startSSHAgent(t, otherPriv))
		if err == nil {
			t.Fatalf("git ls-remote succeeded with an unauthorized key:\n%s", out)
		}
		if !strings.Contains(out, "Permission denied (publickey)") {
			t.Fatalf("git ls-remote failed, but not for want of a key: %v\n%s", err, out)
		}
		if want := "auth publickey git denied " + ssh.FingerprintSHA256(otherSigner.PublicKey()); !strings.Contains(srv.Logs(t), want) {
			t.Errorf("server log lacks %q:\n%s", want, srv.Logs(t))
		}
	})
}
