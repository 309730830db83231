package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/profile"
)

// mountHost makes a HOME with keys and credentials, a workspace, a state
// directory and a directory of data outside them all.
func mountHost(t *testing.T) (c MountConfig, data string) {
	t.Helper()
	root := t.TempDir()
	home := filepath.Join(root, "home")
	for _, d := range []string{".ssh", ".aws", "ws", ".local/state/propio-sandbox", "data/sub", "data/.secrets"} {
		if err := os.MkdirAll(filepath.Join(home, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for f, body := range map[string]string{
		".ssh/id_ed25519":      "key",
		".aws/credentials":     "cred",
		"data/a.txt":           "hello",
		"data/sub/b.txt":       "world",
		"data/.env":            "SECRET=1",
		"data/.secrets/x":      "x",
		"ws/main.go":           "package main",
		"data/link-to-ssh-key": "", // replaced by a hard link below
	} {
		if err := os.WriteFile(filepath.Join(home, f), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	os.Remove(filepath.Join(home, "data/link-to-ssh-key"))
	c = MountConfig{
		Host: profile.GrantHost{Home: home, Workspace: filepath.Join(home, "ws"), Resolve: fsutil.Resolve, SameFile: fsutil.SameFile},
		Own:  []string{filepath.Join(home, ".local/state/propio-sandbox")},
		Hide: []string{".env", ".secrets/", "config/prod.env"},
	}
	return c, filepath.Join(home, "data")
}

func mountReq(source, target string, write bool) ask.Request {
	return ask.Request{Kind: ask.KindMount, Mount: &ask.MountAsk{Source: source, Target: target, Write: write}}
}

// What unsafe guards, the workspace, propio-sandbox's own files, write
// access and what does not exist are refused without asking, each saying
// why.
func TestMountRefusals(t *testing.T) {
	c, data := mountHost(t)
	home := c.Host.Home
	m := NewMounts(c)
	for name, tc := range map[string]struct {
		req  ask.Request
		want string
	}{
		"ssh":       {mountReq(filepath.Join(home, ".ssh"), "", false), "your SSH keys"},
		"ssh key":   {mountReq("~/.ssh/id_ed25519", "", false), "your SSH keys"},
		"cloud":     {mountReq(filepath.Join(home, ".aws"), "", false), "credentials"},
		"home":      {mountReq(home, "", false), "your home directory"},
		"root":      {mountReq("/", "", false), "host's root"},
		"workspace": {mountReq(filepath.Join(home, "ws"), "", false), "is in the workspace"},
		"holds ws":  {mountReq(filepath.Dir(home), "", false), "home directory"},
		"own":       {mountReq(filepath.Join(home, ".local/state/propio-sandbox"), "", false), "propio-sandbox's own files"},
		"write":     {mountReq(data, "", true), "gives no write access"},
		"relative":  {mountReq("data", "", false), "not an absolute host path"},
		"missing":   {mountReq(filepath.Join(data, "nope"), "", false), "does not exist"},
		"hidden":    {mountReq(filepath.Join(data, ".env"), "", false), `hidden by workspace.hide ".env"`},
		"no source": {ask.Request{Kind: ask.KindMount}, "names a host path"},
		"no name":   {mountReq(data, "/..", false), "no name for the copy"},
	} {
		t.Run(name, func(t *testing.T) {
			err := m.Check(tc.req)
			if !errors.Is(err, ErrMountRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Check: %v; want refused, saying %q", err, tc.want)
			}
		})
	}
}

// A source that names its path other than plainly (., .., //, a symbolic
// link anywhere in it) is refused, naming the path it leads to; the
// kernel's views of the host (/proc, /sys, /dev, and their file systems
// mounted elsewhere) are refused as such. What is allowed is asked and
// copied as the path it resolves to.
func TestMountSourceResolved(t *testing.T) {
	c, data := mountHost(t)
	ws := c.Host.Workspace
	outside := filepath.Join(filepath.Dir(c.Host.Home), "etc")
	if err := os.MkdirAll(outside, 0o755); err != nil || os.WriteFile(filepath.Join(outside, "shadow"), []byte("host secret"), 0o644) != nil {
		t.Fatal("making a directory outside:", err)
	}
	if err := os.Symlink(outside, filepath.Join(ws, "test-fixtures")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(data, filepath.Join(c.Host.Home, "data-link")); err != nil {
		t.Fatal(err)
	}
	dotdot := filepath.Join(data, "sub") + "/" + strings.Repeat("sub/../", 40) + "../../../etc"
	m := NewMounts(c)
	for name, tc := range map[string]struct {
		source string
		want   string
	}{
		"link in the workspace": {filepath.Join(ws, "test-fixtures"), "goes through a symbolic link, to " + outside},
		"link below it":         {filepath.Join(ws, "test-fixtures", "shadow"), "to " + filepath.Join(outside, "shadow")},
		"link in HOME":          {"~/data-link/sub", "to " + filepath.Join(data, "sub")},
		"dot-dot":               {dotdot, "(.. in it)"},
		"dot-dot in ~/":         {"~/data/../data", "(.. in it)"},
		"dot":                   {data + "/./sub", "(. in it)"},
		"double slash":          {data + "//sub", "(// in it)"},
		"proc":                  {"/proc", "in /proc"},
		"proc self environ":     {"/proc/self/environ", "in /proc"},
		"sys":                   {"/sys/kernel", "in /sys"},
		"dev":                   {"/dev/null", "in /dev"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := m.Resolve(mountReq(tc.source, "", false))
			if !errors.Is(err, ErrMountRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Resolve(%s): %v; want refused, saying %q", tc.source, err, tc.want)
			}
		})
	}
	t.Run("the kernel's file systems wherever they are", func(t *testing.T) {
		if _, err := os.Stat("/proc/self"); err != nil {
			t.Skip("no /proc here")
		}
		if got := kernelFS("/proc/self"); got != "proc" {
			t.Errorf("kernelFS(/proc/self) = %q, want proc", got)
		}
		if got := kernelFS(data); got != "" {
			t.Errorf("kernelFS(%s) = %q, want none", data, got)
		}
	})
	t.Run("allowed", func(t *testing.T) {
		for source, want := range map[string]string{
			data + "/sub/": filepath.Join(data, "sub"),
			"~/data":       data,
			data:           data,
		} {
			req, err := m.Resolve(mountReq(source, "", false))
			if err != nil || req.Mount.Resolved != want || req.Mount.Source != source {
				t.Errorf("Resolve(%s) = %+v, %v; want it resolved to %s", source, req.Mount, err, want)
			}
		}
	})
}

// The agent never says what its request resolves to; Handle copies only
// what the user was shown.
func TestMountHandleCopiesWhatWasShown(t *testing.T) {
	c, data := mountHost(t)
	rt := &entryRuntime{}
	c.Runtime, c.Volume = rt, backend.Volume{Name: "p_requests-mounts"}
	a, err := ask.ParseAgentAsk([]byte(`{"kind":"mount","mount":{"source":"` + data + `","resolved":"/elsewhere"},"reason":"x"}`))
	if err != nil || a.Mount.Resolved != "" {
		t.Fatalf("ParseAgentAsk kept the agent's resolved path: %+v, %v", a.Mount, err)
	}
	req := mountReq(data, "", false)
	req.Mount.Resolved = filepath.Join(data, "sub")
	if _, err := NewMounts(c).Handle(context.Background(), req); !errors.Is(err, ErrMountRefused) || !strings.Contains(err.Error(), "you were shown") {
		t.Errorf("Handle of a request shown as another path: %v", err)
	}
}

// A hard link to a key inside the directory asked for is refused too.
func TestMountRefusesOtherNameOfKey(t *testing.T) {
	c, data := mountHost(t)
	if err := os.Link(filepath.Join(c.Host.Home, ".ssh/id_ed25519"), filepath.Join(data, "link-to-ssh-key")); err != nil {
		t.Skip("no hard links here:", err)
	}
	err := NewMounts(c).Check(mountReq(data, "", false))
	if !errors.Is(err, ErrMountRefused) || !strings.Contains(err.Error(), "another name") {
		t.Errorf("Check: %v; want refused as another name of a key", err)
	}
}

// An allowed request copies its source under the target's last segment,
// leaving out what hide names; a second one of the same name replaces it
// within the budget.
func TestMountHandle(t *testing.T) {
	c, data := mountHost(t)
	rt := &entryRuntime{}
	c.Runtime, c.Volume, c.Max = rt, backend.Volume{Name: "p_requests-mounts"}, 100
	m := NewMounts(c)
	res, err := m.Handle(context.Background(), mountReq(data, "/opt/my data", false))
	if err != nil {
		t.Fatal(err)
	}
	if res["path"] != "/run/propio-sandbox/mounts/my_data" {
		t.Errorf("path %v", res["path"])
	}
	if got := rt.last; got.Name != "my_data" || got.From != data || !got.Skip[".env"] || !got.Skip[".secrets"] || got.Max != 100 {
		t.Errorf("entry %+v: want my_data from %s, .env and .secrets left out, max 100", got, data)
	}
	if lo, _ := res["left_out"].([]string); strings.Join(lo, ",") != ".env,.secrets" {
		t.Errorf("left_out %v", res["left_out"])
	}
	rt.copied = 60
	if _, err := m.Handle(context.Background(), mountReq(filepath.Join(data, "a.txt"), "", false)); err != nil {
		t.Fatal(err)
	}
	if rt.last.Max != 100 {
		t.Errorf("second copy's max %d: want 100 (the first copied nothing)", rt.last.Max)
	}
	rt.copied = 0
	if _, err := m.Handle(context.Background(), mountReq(filepath.Join(data, "sub"), "", false)); err != nil {
		t.Fatal(err)
	}
	if rt.last.Max != 40 {
		t.Errorf("third copy's max %d: want 40, what a.txt's 60 bytes leave", rt.last.Max)
	}
}

// entryRuntime records CopyEntry.
type entryRuntime struct {
	backend.Runtime
	last   backend.Entry
	copied int64
}

func (r *entryRuntime) CopyEntry(ctx context.Context, v backend.Volume, e backend.Entry) (backend.Copied, error) {
	r.last = e
	return backend.Copied{Bytes: r.copied, Files: 1}, nil
}

// A launch's project has its handler when it was generated with the mounts
// volume, and none otherwise; the copies are bounded by resources.disk.
func TestLaunchMounts(t *testing.T) {
	for _, on := range []bool{false, true} {
		p, env := loadProfile(t, "standard")
		if on {
			p.AgentRequests = []string{"mount"}
		}
		plan, err := NewPlan(env, p)
		if err != nil {
			t.Fatal(err)
		}
		proj, err := plan.Generate(generator.Options{Project: "p"})
		if err != nil {
			t.Fatal(err)
		}
		m, ok := LaunchMounts(nil, proj, env, p, "/ask")
		if ok != on {
			t.Fatalf("Mounts %v: handler %v", on, ok)
		}
		if !on {
			continue
		}
		if m.c.Volume.Name != "p_requests-mounts" || m.c.Volume.Image != p.Image || m.c.Max != int64(p.Resources.Disk) && p.Resources.Disk > 0 {
			t.Errorf("config %+v", m.c)
		}
		if !slices.Contains(m.c.Own, "/ask") || !slices.Contains(m.c.Own, env.Dirs.State) {
			t.Errorf("own directories %v", m.c.Own)
		}
	}
}
