package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/changeset"
)

// dirRuntime keeps each volume as a directory, as the engine's copies do.
type dirRuntime struct {
	backend.Runtime
	root string
}

func (r *dirRuntime) dir(v backend.Volume) string { return filepath.Join(r.root, v.Name) }

func (r *dirRuntime) CopyEntry(ctx context.Context, v backend.Volume, e backend.Entry) (backend.Copied, error) {
	dst := filepath.Join(r.dir(v), e.Name)
	os.RemoveAll(dst)
	if err := os.MkdirAll(r.dir(v), 0o755); err != nil {
		return backend.Copied{}, err
	}
	out, err := exec.Command("cp", "-a", e.From, dst).CombinedOutput()
	if err != nil {
		return backend.Copied{}, errors.New(string(out))
	}
	return backend.Copied{Files: 1}, nil
}

func (r *dirRuntime) CopyOut(ctx context.Context, v backend.Volume, to string) error {
	out, err := exec.Command("cp", "-a", r.dir(v), to).CombinedOutput()
	if err != nil {
		return errors.New(string(out))
	}
	return nil
}

type notes struct{ Reporter }

func (n *notes) Note(string) {}

// writeHost is mountHost with a writes volume and a changeset store, and
// a directory without hidden files to write to.
func writeHost(t *testing.T) (MountConfig, *dirRuntime, string) {
	c, data := mountHost(t)
	rt := &dirRuntime{root: t.TempDir()}
	c.Runtime, c.Writes, c.Changesets = rt, backend.Volume{Name: "p_requests-mounts-rw"}, changeset.Store{Dir: t.TempDir()}
	c.Max = 1 << 20
	return c, rt, filepath.Join(data, "sub")
}

// What the agent writes to a writable copy comes back as a changeset whose
// original is the host path, which stays as it was.
func TestMountWrite(t *testing.T) {
	c, rt, sub := writeHost(t)
	m := NewMounts(c)
	res, err := m.Handle(context.Background(), mountReq(sub, "", true))
	if err != nil {
		t.Fatal(err)
	}
	if res["path"] != "/run/propio-sandbox/mounts-rw/sub" {
		t.Errorf("path %v", res["path"])
	}
	copyDir := filepath.Join(rt.root, "p_requests-mounts-rw", "sub")
	os.WriteFile(filepath.Join(copyDir, "b.txt"), []byte("changed\n"), 0o600)
	os.WriteFile(filepath.Join(copyDir, "new.txt"), []byte("new\n"), 0o600)
	if err := m.CopyBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.FinishWrites(&notes{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Handle(context.Background(), mountReq(filepath.Join(c.Host.Home, "data"), "other", true)); err == nil {
		t.Error("a write request after the copy back was carried out")
	}
	list, err := c.Changesets.List()
	if err != nil || len(list) != 1 {
		t.Fatalf("changesets %v, %v: want one", list, err)
	}
	changes, err := list[0].Changes()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ch := range changes {
		got = append(got, string(ch.Kind)+" "+ch.Path)
	}
	if strings.Join(got, ",") != "modified b.txt,added new.txt" && strings.Join(got, ",") != "added new.txt,modified b.txt" {
		t.Errorf("changes %v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(sub, "b.txt")); string(b) != "world" {
		t.Errorf("host b.txt is %q", b)
	}
}

// An unchanged copy leaves no changeset; a source with hidden files, or a
// file, gets no write access.
func TestMountWriteUnchangedAndRefused(t *testing.T) {
	c, _, sub := writeHost(t)
	m := NewMounts(c)
	if _, err := m.Handle(context.Background(), mountReq(sub, "", true)); err != nil {
		t.Fatal(err)
	}
	if err := m.CopyBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.FinishWrites(&notes{}); err != nil {
		t.Fatal(err)
	}
	if list, _ := c.Changesets.List(); len(list) != 0 {
		t.Errorf("changesets %v: want none", list)
	}
	data := filepath.Dir(sub)
	for src, want := range map[string]string{data: "workspace.hide", filepath.Join(data, "a.txt"): "not a directory"} {
		if err := NewMounts(c).Check(mountReq(src, "", true)); !errors.Is(err, ErrMountRefused) || !strings.Contains(err.Error(), want) {
			t.Errorf("Check %s: %v; want refused, saying %q", src, err, want)
		}
	}
}
