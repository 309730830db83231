package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/profile"
	launch "github.com/propio/propio-sandbox/internal/sandbox"
)

// TestMountRequest carries out mount requests for a running sandbox, as its
// launcher does once the user allowed them (the handler is called here
// directly; the agent's channel to it is tested with it): a host directory
// outside the workspace appears, read-only, at
// /run/propio-sandbox/mounts/NAME; a second request replaces the copy
// (what was deleted on the host is gone inside); ~/.ssh is refused and
// never appears; nothing is left once the sandbox ends.
func TestMountRequest(t *testing.T) {
	for _, mode := range []string{"none", "open", "allowlist"} {
		t.Run(mode, func(t *testing.T) {
			s := newSandbox(t)
			data := filepath.Join(s.Home, "data")
			writeFiles(t, data, map[string]string{"a.txt": "hello from the host", "sub/b.txt": "below", "old.txt": "deleted later"})
			writeFiles(t, filepath.Join(s.Home, ".ssh"), map[string]string{"id_ed25519": "PRIVATE KEY"})
			net := "agent_requests: [mount]\nnetwork: {mode: " + mode + "}\n"
			if mode == "allowlist" {
				net = "agent_requests: [mount]\nnetwork: {mode: allowlist, allow: [allowed.test]}\n"
			}
			p := s.Profile(net)
			l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
			l.waitStdout(t, "ready", time.Minute)

			agent, project := agentOf(t, s)
			m := mountsFor(t, s, project)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := m.Handle(ctx, mountAsk(data, ""))
			if err != nil {
				t.Fatalf("mount request for %s: %v", data, err)
			}
			if res["path"] != "/run/propio-sandbox/mounts/data" || res["files"] != int64(3) {
				t.Errorf("result %v: want path /run/propio-sandbox/mounts/data and 3 files", res)
			}
			inside := func(args ...string) (string, error) {
				return docker(append([]string{"exec", agent, "/probe"}, args...)...)
			}
			if out, err := inside("read", "/run/propio-sandbox/mounts/data/a.txt"); err != nil || out != "hello from the host" {
				t.Errorf("reading the copy inside: %q, %v", out, err)
			}
			if out, err := inside("fs", "write /run/propio-sandbox/mounts/data/a.txt changed"); err == nil || !strings.Contains(out, "read-only") {
				t.Errorf("writing the copy inside: want read-only file system, got %q, %v", out, err)
			}

			// A second request copies again: a snapshot, replaced whole.
			os.Remove(filepath.Join(data, "old.txt"))
			writeFiles(t, data, map[string]string{"a.txt": "changed on the host"})
			if _, err := m.Handle(ctx, mountAsk(data, "")); err != nil {
				t.Fatal(err)
			}
			if out, err := inside("read", "/run/propio-sandbox/mounts/data/a.txt"); err != nil || out != "changed on the host" {
				t.Errorf("reading the second copy inside: %q, %v", out, err)
			}
			if out, err := inside("ls", "/run/propio-sandbox/mounts/data"); err != nil || strings.Contains(out, "old.txt") {
				t.Errorf("the second copy still holds what the host deleted: %q, %v", out, err)
			}

			// ~/.ssh is refused without asking, and never copied.
			_, err = m.Handle(ctx, mountAsk(filepath.Join(s.Home, ".ssh"), ""))
			if !errors.Is(err, launch.ErrMountRefused) || m.Check(mountAsk(filepath.Join(s.Home, ".ssh"), "")) == nil {
				t.Errorf("mount request for ~/.ssh: %v; want refused", err)
			}
			if out, _ := inside("find", "PRIVATE KEY", "/run/propio-sandbox/mounts"); !strings.Contains(out, "searched") || strings.Contains(out, "found") {
				t.Errorf("the key is readable inside:\n%s", out)
			}

			l.signal(t, syscall.SIGTERM)
			l.wait(t, time.Minute)
			if left := s.Leftovers(); len(left) > 0 {
				t.Errorf("left once the sandbox ended: %v", left)
			}
		})
	}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// agentOf finds the running agent container of the workspace's sandbox,
// and its project.
// On a loaded machine the sandbox's output ("ready") can come before the
// engine lists it running: it is looked for again, a bounded time.
func agentOf(t *testing.T, s *sandbox) (id, project string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := docker("ps", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace, "--filter", "label=com.docker.compose.service=agent",
			"--format", `{{.ID}} {{.Label "dev.propio-sandbox.project"}}`)
		id, project, ok := strings.Cut(firstLine(out), " ")
		switch {
		case err == nil && ok:
			return id, project
		case err != nil || time.Now().After(deadline):
			t.Fatalf("finding the agent's container: %q, %v", out, err)
		}
		time.Sleep(100 * time.Millisecond) // the engine says nothing to the test
	}
}

// mountsFor is the mount requests' handler of the sandbox project, as its
// launcher makes it.
func mountsFor(t *testing.T, s *sandbox, project string) *launch.Mounts {
	t.Helper()
	conn, err := launch.Connect(context.Background(), launch.Auto, launch.Streams{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return launch.NewMounts(launch.MountConfig{
		Runtime: conn.Runtime,
		Volume: backend.Volume{Name: generator.MountsVolume(project), Image: ProbeImage,
			Labels: map[string]string{backend.LabelProject: project, generator.LabelWorkspace: s.Workspace}},
		Host: profile.GrantHost{Home: s.Home, Workspace: s.Workspace, Resolve: fsutil.Resolve, SameFile: fsutil.SameFile},
		Own:  []string{filepath.Join(s.Home, ".config", "propio-sandbox"), filepath.Join(s.Home, ".local", "state", "propio-sandbox")},
	})
}

func mountAsk(source, target string) ask.Request {
	return ask.Request{Kind: ask.KindMount, Reason: "read the data", Mount: &ask.MountAsk{Source: source, Target: target}}
}
