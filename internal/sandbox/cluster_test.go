package sandbox

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
)

// A sandbox's name on a cluster is a DNS label with room for its objects'
// suffixes, and no two launches share one.
func TestClusterName(t *testing.T) {
	label := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	seen := map[string]bool{}
	for _, ws := range []string{"/home/me/project", "/home/me/My_Project.v2", "/x/" + strings.Repeat("long-name", 10)} {
		for range 3 {
			n, err := clusterName(ws)
			if err != nil {
				t.Fatal(err)
			}
			if !label.MatchString(n) || len(n) > 57 {
				t.Errorf("clusterName(%q) = %q: not a DNS label of at most 57 characters", ws, n)
			}
			if seen[n] {
				t.Errorf("clusterName(%q) gave %q twice", ws, n)
			}
			seen[n] = true
		}
	}
}

// What the sandbox could not change comes back as it went in, whatever
// the copy out of its Pod holds: a hidden file rewritten, a readonly
// directory replaced by a link out of the tree, a guard path added.
func TestRestoreProtected(t *testing.T) {
	orig, tree, outside := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(root, rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	write(orig, ".env", "SECRET=1")
	write(orig, "src/ro.txt", "read only")
	write(orig, "main.go", "package main")
	write(tree, ".env", "forged")
	write(tree, "main.go", "changed")
	if err := os.Symlink(outside, filepath.Join(tree, "src")); err != nil {
		t.Fatal(err)
	}
	write(tree, ".git/hooks/pre-commit", "evil")
	if err := restoreProtected(tree, orig, []string{".env", "src", ".git/hooks"}); err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]string{".env": "SECRET=1", "src/ro.txt": "read only", "main.go": "changed"} {
		if b, err := os.ReadFile(filepath.Join(tree, rel)); err != nil || string(b) != want {
			t.Errorf("%s: %q (%v), want %q", rel, b, err, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(tree, "src")); err != nil || !fi.IsDir() {
		t.Errorf("src is not a directory of the tree again: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(tree, ".env")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf(".env's mode: %v %v, want 0640", fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(tree, ".git/hooks")); err == nil {
		t.Error("a guard path the original lacks is in the tree")
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("the restore wrote outside the tree: %v", entries)
	}
}

// The protected paths are the sandbox's read-only mounts inside the
// workspace, as the generator makes them for a profile's hide and
// readonly rules and the git guard.
func TestProtectedPaths(t *testing.T) {
	objs := &generator.KubeObjects{}
	objs.Pod.Spec.InitContainers = []generator.KubeContainer{{Name: generator.KubeCopyContainer, VolumeMounts: []generator.KubeVolumeMount{{MountPath: "/workspace"}}}}
	objs.Pod.Spec.Containers = []generator.KubeContainer{{Name: "sandbox", VolumeMounts: []generator.KubeVolumeMount{
		{MountPath: "/workspace"}, {MountPath: "/workspace/.env", ReadOnly: true}, {MountPath: "/workspace/src", ReadOnly: true},
		{MountPath: "/workspace/.git"}, {MountPath: "/etc/passwd", ReadOnly: true}, {MountPath: "/workspace-other/x", ReadOnly: true},
	}}, {Name: generator.KubeKeeperContainer, VolumeMounts: []generator.KubeVolumeMount{{MountPath: "/workspace", ReadOnly: true}}}}
	got := protectedPaths(objs)
	if !slices.Equal(got, []string{".env", "src"}) {
		t.Errorf("protectedPaths = %q, want .env and src", got)
	}
}

// A cluster sandbox's log on the host: started with its header, as on an
// engine, and then the whole entries of what its gateway's Pod gives,
// written as they come (logs reads them during the run); a line that is
// not an entry, and a partial last one, are left out, and Close says so.
func TestClusterLog(t *testing.T) {
	e := Env{Dirs: hostinfo.Dirs{State: t.TempDir()}, Workspace: "/work/ws"}
	p := &profile.Profile{}
	p.Meta.File = "builtin:strict"
	w, err := startClusterLog(e, p, "propio-ws-0a1b2c")
	if err != nil {
		t.Fatal(err)
	}
	path := decisionlog.Path(e.Dirs.LogDir(), "propio-ws-0a1b2c")
	entry := `{"time":"2026-11-22T10:00:00Z","client":"10.0.0.3:4000","via":"http","host":"a.test","port":80,"allowed":true,"reason":"allowed","bytes_up":1,"bytes_down":2}` + "\n"
	if _, err := io.WriteString(w, entry[:40]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(w, entry[40:]+`{"host":"forged.test","allowed":true,"x":1}`+"\n"+entry[:30]); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); ; {
		if got, _ := decisionlog.Read(path); len(got) == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the entry is not in the log while the run goes on")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), "1 line(s) left out") {
		t.Errorf("Close returned %v, want one line left out", err)
	}
	if latest, err := decisionlog.Latest(e.Dirs.LogDir(), "/work/ws"); err != nil || latest != path {
		t.Errorf("the latest log of the workspace is %q (%v), want %s", latest, err, path)
	}
	got, err := decisionlog.Read(path)
	if err != nil || len(got) != 1 || got[0].Host != "a.test" || got[0].DecidedBy != "rule" {
		t.Errorf("the log holds %+v (%v), want the entry for a.test alone", got, err)
	}
}
