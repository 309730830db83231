package generator_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
)

// On a remote engine, directories the sandbox reads are snapshots (volumes
// the launch fills with a copy, mounted read-only, never copied back);
// what it mounts of them, the hidden files' mask and the account files
// are mounted from copies in the engine's volumes; the git configuration
// is not mounted; and no service mounts a path of this host: a mount that
// would is an error naming it.
func TestRemoteEngine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "profile.yaml")
	yaml := "image: img:1\nnetwork: {mode: none}\nuser: host\nworkspace: {mode: ro}\ngit: {config: true}\nssh_agent: \"off\"\n" +
		"mounts:\n  - {source: /srv/data, target: /data, mode: ro}\n  - {source: /srv/repo, target: /repo, mode: changeset}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Locations{}.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := fixtureHost(t, p)
	h.Matches = []generator.Match{{Path: ".env", Hide: true}, {Path: ".propio", Dir: true}}
	h.Guard = []generator.GuardPath{{Root: "mount-1", Path: ".git/config", ReadOnly: true}}
	h.Engine.Remote, h.Engine.VolumeRoot = true, "/var/lib/docker/volumes"
	h.Changeset = &generator.Changeset{ID: "20261122-064500-3f9a", Mode: generator.ChangesetCopy, Mounts: []generator.ChangesetMount{
		{Name: "mount-1", Source: "/srv/repo", Target: "/repo", CopyIn: "/srv/repo", CopyOut: "/state/tree"},
	}}
	proj, err := generator.Generate(p, h, generator.Options{Project: project})
	if err != nil {
		t.Fatal(err)
	}
	svc := proj.Services[generator.Service]
	var got []string
	for _, v := range svc.Volumes {
		got = append(got, v.Type+" "+v.Source+" "+v.Target+" "+map[bool]string{true: "ro", false: "rw"}[v.ReadOnly])
	}
	vols := "bind /var/lib/docker/volumes/" + project + "-"
	want := []string{"volume snapshot-workspace /workspace ro",
		vols + "files-mask/_data/empty /workspace/.env ro",
		"volume snapshot-mount-0 /data ro", "volume changeset-mount-1 /repo rw",
		vols + "files-accounts/_data/1000-1000.passwd /etc/passwd ro",
		vols + "files-accounts/_data/1000-1000.group /etc/group ro",
		vols + "changeset-mount-1/_data/.git/config /repo/.git/config ro",
	}
	if !slices.Equal(got, want) {
		t.Errorf("mounts %q, want %q", got, want)
	}
	for _, key := range []string{"snapshot-workspace", "snapshot-mount-0"} {
		v, ok := proj.Volumes[key]
		if !ok || v.Name != project+"-"+key || v.Labels[generator.LabelWorkspace] != h.Workspace {
			t.Errorf("volume %s: %+v", key, v)
		}
	}
	ext, err := generator.ReadExtension(proj)
	if err != nil {
		t.Fatal(err)
	}
	wantCopies := []generator.VolumeCopy{{Volume: "snapshot-workspace", In: h.Workspace}, {Volume: "snapshot-mount-0", In: "/srv/data"},
		{Volume: generator.MaskVolumeKey, In: filepath.Dir(h.EmptyFile)}, {Volume: generator.AccountsVolumeKey, In: filepath.Dir(h.Passwd)}}
	if !slices.Equal(ext.Copies, wantCopies) || ext.Changeset == nil || len(ext.Changeset.Copies) != 1 {
		t.Errorf("extension copies %+v and changeset %+v, want %+v and the changeset's one", ext.Copies, ext.Changeset, wantCopies)
	}
	// Rendered and loaded back, the snapshots are still there.
	out, err := generator.Render(proj)
	if err != nil {
		t.Fatal(err)
	}
	back, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  proj.WorkingDir,
		ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: out}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName(project, true) })
	if err != nil {
		t.Fatalf("compose-go cannot load the rendered project: %v\n%s", err, out)
	}
	if ext2, err := generator.ReadExtension(back); err != nil || !slices.Equal(ext2.Copies, wantCopies) {
		t.Errorf("loaded back: %+v, %v", ext2.Copies, err)
	}

	// Without the engine's volume directory, the host's files stay host
	// paths, refused.
	h.Engine.VolumeRoot = ""
	_, err = generator.Generate(p, h, generator.Options{Project: project})
	var rm *generator.RemoteMountError
	if !errors.As(err, &rm) || len(rm.Mounts) != 4 || !strings.Contains(strings.Join(rm.Mounts, "\n"), h.EmptyFile+" at /workspace/.env (service agent)") || len(rm.Hints()) == 0 {
		t.Errorf("host files on a remote engine: %v", err)
	}
	// Without a remote engine, it is all bind mounts, as always.
	h.Engine.Remote = false
	proj, err = generator.Generate(p, h, generator.Options{Project: project})
	if err != nil {
		t.Fatal(err)
	}
	binds := 0
	for _, v := range proj.Services[generator.Service].Volumes {
		if v.Type == types.VolumeTypeBind {
			binds++
		}
	}
	if binds < 7 { // the workspace, .env, /data, the account files, the git configuration, .git/config
		t.Errorf("a local engine's project has %d bind mounts", binds)
	}
}

// On a remote engine, the allowlist gateway's decision log is a volume
// copied from the log's stage and back to it, and the sandbox's
// resolv.conf comes from a copy of its directory; without a stage, the
// log directory is a host path, refused.
func TestRemoteEngineGateway(t *testing.T) {
	path := filepath.Join(t.TempDir(), "profile.yaml")
	yaml := "image: img:1\nnetwork: {mode: allowlist, allow: [a.test]}\nssh_agent: \"off\"\ngit: {config: false}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Locations{}.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := fixtureHost(t, p)
	h.Matches, h.Guard = nil, nil
	h.Engine.Remote, h.Engine.VolumeRoot = true, "/var/lib/docker/volumes"
	h.RemoteLogs = "/home/dev/.local/state/propio-sandbox/remote-logs"
	stage := h.RemoteLogs + "/" + project
	// The workspace in changeset mode, as a launch on a remote engine has it.
	p.Workspace.Mode = profile.ModeChangeset
	h.Changeset = &generator.Changeset{ID: "20261122-064500-3f9a", Mode: generator.ChangesetCopy, Mounts: []generator.ChangesetMount{
		{Name: generator.WorkspaceMount, Source: h.Workspace, Target: "/workspace", CopyIn: h.Workspace, CopyOut: "/state/tree"},
	}}
	o := generator.Options{Project: project, GatewayImage: "propio-sandbox/gateway:test"}
	proj, err := generator.Generate(p, h, o)
	if err != nil {
		t.Fatal(err)
	}
	gw := proj.Services[generator.GatewayService]
	found := false
	for _, v := range gw.Volumes {
		found = found || v.Type == "volume" && v.Source == generator.GatewayLogVolumeKey && v.Target == generator.GatewayLogDir && !v.ReadOnly
	}
	if !found {
		t.Errorf("the gateway's volumes %+v have no log volume at %s", gw.Volumes, generator.GatewayLogDir)
	}
	resolv := ""
	for _, v := range proj.Services[generator.Service].Volumes {
		if v.Target == "/etc/resolv.conf" {
			resolv = v.Source
		}
	}
	if want := "/var/lib/docker/volumes/" + project + "-files-resolv/_data/"; !strings.HasPrefix(resolv, want) {
		t.Errorf("resolv.conf from %q, want from %s...", resolv, want)
	}
	ext, err := generator.ReadExtension(proj)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ext.Copies, generator.VolumeCopy{Volume: generator.GatewayLogVolumeKey, In: stage, Out: stage}) ||
		!slices.Contains(ext.Copies, generator.VolumeCopy{Volume: generator.ResolvVolumeKey, In: h.ResolvDir}) {
		t.Errorf("copies %+v", ext.Copies)
	}
	h.RemoteLogs = ""
	_, err = generator.Generate(p, h, o)
	var rm *generator.RemoteMountError
	if !errors.As(err, &rm) || !strings.Contains(strings.Join(rm.Mounts, "\n"), h.LogDir+" at /log (service gateway)") {
		t.Errorf("a gateway log without a stage: %v", err)
	}
}
