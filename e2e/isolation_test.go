package e2e

// Filesystem isolation, observed from inside real sandboxes: what the probe
// can read and write, and what the host sees afterwards.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// isolationWriteFile writes a host file, making its directory.
func isolationWriteFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// isolationHasContent fails the test unless the host file at path holds want.
func isolationHasContent(t *testing.T, path, want string) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("on the host: %v", err)
	}
	if string(got) != want {
		t.Fatalf("on the host, %s holds %q, want %q", path, got, want)
	}
}

// isolationAbsent fails the test unless nothing exists at the host path.
func isolationAbsent(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("on the host, %s should not exist (lstat: %v)", path, err)
	}
}

// isolationOwner returns the uid and gid of a host file.
func isolationOwner(t *testing.T, path string) (uid, gid uint32) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("on the host: %v", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

// TestIsolationWorkspace: the workspace is /workspace, the working directory;
// host files there and in subdirectories are readable inside, and files
// written inside with relative paths land in the host workspace.
func TestIsolationWorkspace(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := s.Profile(probeOffline)
	isolationWriteFile(t, filepath.Join(s.Workspace, "from_host.txt"), "made on the host\n")
	isolationWriteFile(t, filepath.Join(s.Workspace, "sub", "dir", "deep.txt"), "deep on the host\n")

	probeOK(t, probeRun(s, p, "id"), "cwd=/workspace ")
	probeOK(t, probeRun(s, p, "read", "from_host.txt"), "made on the host")
	probeOK(t, probeRun(s, p, "read", "/workspace/sub/dir/deep.txt"), "deep on the host")
	probeOK(t, probeRun(s, p, "read", "sub/dir/deep.txt"), "deep on the host")

	probeOK(t, probeRun(s, p, "write", "session_context.txt", "hello"), "wrote session_context.txt")
	isolationHasContent(t, filepath.Join(s.Workspace, "session_context.txt"), "hello")
	probeOK(t, probeRun(s, p, "write", "sub/dir/out.txt", "written below"), "wrote sub/dir/out.txt")
	isolationHasContent(t, filepath.Join(s.Workspace, "sub", "dir", "out.txt"), "written below")
	// A file the host changed is seen changed: the workspace is the host's
	// directory, not a copy.
	isolationWriteFile(t, filepath.Join(s.Workspace, "from_host.txt"), "changed on the host\n")
	probeOK(t, probeRun(s, p, "read", "from_host.txt"), "changed on the host")
}

// TestIsolationOwnership: what the sandbox writes in the workspace belongs
// to the user who ran the launcher, root or not.
func TestIsolationOwnership(t *testing.T) {
	t.Parallel()
	t.Run("invoking-user", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile(probeOffline)
		probeOK(t, probeRun(s, p, "id"), fmt.Sprintf("uid=%d gid=%d cwd=/workspace", os.Getuid(), os.Getgid()))
		probeOK(t, probeRun(s, p, "write", "mine.txt", "x"), "wrote")
		if uid, gid := isolationOwner(t, filepath.Join(s.Workspace, "mine.txt")); int(uid) != os.Getuid() || int(gid) != os.Getgid() {
			t.Fatalf("mine.txt is owned by %d:%d, want the invoking %d:%d", uid, gid, os.Getuid(), os.Getgid())
		}
	})
	t.Run("non-root", func(t *testing.T) {
		t.Parallel()
		if os.Getuid() != 0 {
			t.Skipf("running as uid %d: only root can start the launcher as another user", os.Getuid())
		}
		const id = 4242
		s := newSandbox(t)
		if testenv.EnginePodman(t) {
			// This launcher of uid 4242 uses the rootful Podman of the
			// pass, so the files are the launcher's. A rootless Podman's
			// user (keep-id) is .ci/run's rootless pass, which runs
			// TestIsolationOwnership as that user against its own Podman.
			t.Log("Podman here is rootful: the rootless case is .ci/run's rootless pass")
		}
		p := s.Profile(probeOffline)
		sockGID := isolationSocketGID(t)
		bin := isolationUserLauncher(t, s, id)
		run := func(args ...string) Result {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := s.Command(ctx, append([]string{"run", "-p", p, "--"}, args...)...)
			cmd.Path, cmd.Args[0] = bin, bin
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{sockGID}}}
			return runCmd(t, ctx, cmd)
		}

		r := run("id")
		probeOK(t, r, "uid=4242 gid=4242 cwd=/workspace ")
		home := regexp.MustCompile(`home=(\S+)`).FindStringSubmatch(r.Stdout)
		if home == nil {
			t.Fatalf("no home= in the probe's id:\n%s", r)
		}
		probeOK(t, run("write", home[1]+"/x", "in home"), "wrote")
		probeOK(t, run("write", "session_context.txt", "hello"), "wrote")
		path := filepath.Join(s.Workspace, "session_context.txt")
		isolationHasContent(t, path, "hello")
		if uid, gid := isolationOwner(t, path); uid != id || gid != id {
			t.Fatalf("a file written by a sandbox of uid 4242 is owned by %d:%d on the host", uid, gid)
		}
	})
}

// isolationSocketGID is the group of the engine socket, which a non-root
// launcher needs to reach the engine.
func isolationSocketGID(t *testing.T) uint32 {
	t.Helper()
	path := engineSocket(t)
	fi, err := os.Stat(path)
	if err != nil {
		t.Skipf("no engine socket to give uid 4242 access to: %v", err)
	}
	return fi.Sys().(*syscall.Stat_t).Gid
}

// isolationUserLauncher hands s's workspace and home to uid and returns a copy of the
// launcher that uid can execute (the built one sits in a root-only directory).
func isolationUserLauncher(t *testing.T, s *sandbox, uid int) string {
	t.Helper()
	base := filepath.Dir(s.Workspace)
	// t.TempDir makes its directories 0700: let uid through to its own.
	for _, d := range []string{base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, root := range []string{s.Workspace, s.Home} {
		err := filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(path, uid, uid)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(launcher)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "propio-sandbox")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestIsolationOutsideRead: host files outside the workspace, the user's
// credentials among them, do not exist inside.
func TestIsolationOutsideRead(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := s.Profile(probeOffline)
	creds := filepath.Join(s.Home, ".aws", "credentials")
	isolationWriteFile(t, creds, "[default]\naws_secret_access_key = e2e-not-a-secret\n")
	other := filepath.Join(t.TempDir(), "host-only.txt")
	isolationWriteFile(t, other, "host only\n")

	for _, path := range []string{creds, other, filepath.Dir(other), "/home/sandbox/.aws/credentials"} {
		r := probeRun(s, p, "read", path)
		probeFails(t, r, "no such file or directory")
		if strings.Contains(r.Stdout+r.Stderr, "e2e-not-a-secret") || strings.Contains(r.Stdout+r.Stderr, "host only") {
			t.Fatalf("host content leaked:\n%s", r)
		}
	}
}

// TestIsolationOutsideWrite: writes outside the workspace never reach the
// host: a read-only root filesystem refuses them, a writable one keeps them
// in the container.
func TestIsolationOutsideWrite(t *testing.T) {
	t.Parallel()
	// Names no host has, so that "absent afterwards" means something.
	etc := "/etc/propio-e2e-" + randomID()
	root := "/propio-e2e-" + randomID()
	for _, path := range []string{etc, root} {
		isolationAbsent(t, path)
	}
	t.Run("read-only-rootfs", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile(probeOffline + "security: {read_only_rootfs: true}\n")
		for _, path := range []string{etc, root} {
			probeFails(t, probeRun(s, p, "write", path, "x"), "read-only file system")
			isolationAbsent(t, path)
		}
		// The workspace, /tmp and HOME stay writable.
		probeOK(t, probeRun(s, p, "write", "still-writable.txt", "x"), "wrote")
		probeOK(t, probeRun(s, p, "write", "/tmp/x", "x"), "wrote")
		probeOK(t, probeRun(s, p, "write", "/home/sandbox/x", "x"), "wrote")
	})
	t.Run("writable-rootfs", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile(probeOffline)
		for _, path := range []string{etc, root} {
			r := probeRun(s, p, "write", path, "x")
			if os.Getuid() == 0 {
				// Root may write to the container's own layer...
				probeOK(t, r, "wrote "+path)
			} else {
				probeFails(t, r, "permission denied")
			}
			isolationAbsent(t, path)
			// ...which goes with the container: the next sandbox has no trace.
			probeFails(t, probeRun(s, p, "read", path), "no such file or directory")
		}
	})
}

// TestIsolationReadOnly: workspace.readonly paths and ro mounts can be read
// but not written, and the host keeps their content.
func TestIsolationReadOnly(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	extra := t.TempDir()
	isolationWriteFile(t, filepath.Join(extra, "agent.json"), `{"from": "mount"}`)
	isolationWriteFile(t, filepath.Join(s.Workspace, "config", "settings.json"), `{"from": "workspace"}`)
	p := s.Profile(probeOffline + fmt.Sprintf(`workspace:
  readonly: [config]
mounts:
  - {source: %q, target: /app/.propio, mode: ro}
`, extra))

	probeOK(t, probeRun(s, p, "read", "config/settings.json"), `{"from": "workspace"}`)
	probeOK(t, probeRun(s, p, "read", "/app/.propio/agent.json"), `{"from": "mount"}`)
	for _, path := range []string{"config/settings.json", "config/new.json", "/app/.propio/agent.json", "/app/.propio/new.json"} {
		probeFails(t, probeRun(s, p, "write", path, "changed"), "read-only file system")
	}
	// The rest of the workspace stays writable.
	probeOK(t, probeRun(s, p, "write", "notes.txt", "x"), "wrote")

	isolationHasContent(t, filepath.Join(s.Workspace, "config", "settings.json"), `{"from": "workspace"}`)
	isolationHasContent(t, filepath.Join(extra, "agent.json"), `{"from": "mount"}`)
	isolationAbsent(t, filepath.Join(s.Workspace, "config", "new.json"))
	isolationAbsent(t, filepath.Join(extra, "new.json"))
}

// TestIsolationHide: hidden files read as empty, hidden directories list as
// empty, neither can be written, and the host's files are untouched.
func TestIsolationHide(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := s.Profile(probeOffline + "workspace:\n  hide: [.env, secrets]\n")
	env := filepath.Join(s.Workspace, ".env")
	deepEnv := filepath.Join(s.Workspace, "app", ".env")
	key := filepath.Join(s.Workspace, "secrets", "key.pem")
	isolationWriteFile(t, env, "API_KEY=e2e-hidden-value\n")
	isolationWriteFile(t, deepEnv, "API_KEY=e2e-deep-hidden-value\n")
	isolationWriteFile(t, key, "-----BEGIN e2e-----\n")

	for _, path := range []string{".env", "app/.env"} {
		r := probeRun(s, p, "read", path)
		if r.Code != 0 || r.Stdout != "" {
			t.Fatalf("want %s to read as empty:\n%s", path, r)
		}
		probeFails(t, probeRun(s, p, "write", path, "overwritten"), "read-only file system")
	}
	if r := probeRun(s, p, "ls", "secrets"); r.Code != 0 || r.Stdout != "" {
		t.Fatalf("want secrets to list as empty:\n%s", r)
	}
	probeFails(t, probeRun(s, p, "read", "secrets/key.pem"), "no such file or directory")
	probeFails(t, probeRun(s, p, "write", "secrets/key.pem", "overwritten"), "read-only file system")
	probeFails(t, probeRun(s, p, "write", "secrets/new.pem", "new"), "read-only file system")

	isolationHasContent(t, env, "API_KEY=e2e-hidden-value\n")
	isolationHasContent(t, deepEnv, "API_KEY=e2e-deep-hidden-value\n")
	isolationHasContent(t, key, "-----BEGIN e2e-----\n")
	isolationAbsent(t, filepath.Join(s.Workspace, "secrets", "new.pem"))
}

// TestIsolationMissingMount: a missing mount source stops the run before
// anything starts, naming where the profile asks for it, and is never
// created; an optional one is skipped.
func TestIsolationMissingMount(t *testing.T) {
	t.Parallel()
	t.Run("required", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		missing := filepath.Join(t.TempDir(), "not", "there")
		// Line 1 is the image line Profile adds.
		p := s.Profile(probeOffline + "mounts:\n  - source: " + missing + "\n    target: /data\n")
		r := probeRun(s, p, "id")
		if r.Code != 3 || !strings.Contains(r.Stderr, "preflight check mounts failed") {
			t.Fatalf("want exit 3 from the mounts check for a missing mount source:\n%s", r)
		}
		want := p + ":4:13: mounts[0].source: "
		if !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, missing) {
			t.Fatalf("want the error to name %q and the missing path %s:\n%s", want, missing, r)
		}
		if strings.Contains(r.Stdout, "uid=") {
			t.Fatalf("the probe ran:\n%s", r)
		}
		isolationAbsent(t, missing)
		isolationAbsent(t, filepath.Dir(missing))
	})
	t.Run("optional", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		missing := filepath.Join(t.TempDir(), "not", "there")
		p := s.Profile(probeOffline + "mounts:\n  - {source: " + strconv.Quote(missing) + ", target: /data, optional: true}\n")
		probeOK(t, probeRun(s, p, "id"), "cwd=/workspace")
		probeFails(t, probeRun(s, p, "ls", "/data"), "no such file or directory")
		isolationAbsent(t, missing)
		isolationAbsent(t, filepath.Dir(missing))
	})
}
