package profile_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/profile"
)

func TestNeedsTrust(t *testing.T) {
	tests := map[string]struct {
		files map[string]string // under a directory holding ws/ (the workspace) and cfg/
		ref   string            // what Resolve is asked for
		want  bool
	}{
		"built-in": {
			ref:  "offline",
			want: false,
		},
		"user profile outside the workspace": {
			files: map[string]string{"cfg/mine.yaml": "extends: open\n"},
			ref:   "mine",
			want:  false,
		},
		"repository profile": {
			files: map[string]string{"ws/.propio/sandbox.yaml": "extends: open\n"},
			ref:   "",
			want:  true,
		},
		"file in the workspace named by path": {
			files: map[string]string{"ws/tools/sandbox.yaml": "extends: open\n"},
			ref:   "ws/tools/sandbox.yaml",
			want:  true,
		},
		"user profile that extends a file in the workspace": {
			files: map[string]string{
				"cfg/mine.yaml": "extends: ../ws/base.yaml\n",
				"ws/base.yaml":  "extends: open\n",
			},
			ref:  "mine",
			want: true,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFiles(t, dir, tt.files)
			ws := filepath.Join(dir, "ws")
			ref := tt.ref
			if strings.Contains(ref, "/") {
				ref = filepath.Join(dir, ref)
			}
			p, err := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: ws}.Resolve(ref)
			if err != nil {
				t.Fatal(err)
			}
			if got := profile.NeedsTrust(p, ws); got != tt.want {
				t.Errorf("NeedsTrust = %v, want %v (chain %+v)", got, tt.want, p.Meta.Chain)
			}
		})
	}
}

func TestTrust(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	state := filepath.Join(t.TempDir(), "state") // Trust creates it
	writeFiles(t, ws, map[string]string{
		".propio/sandbox.yaml": "extends: ./base.yaml\ndescription: repo\n",
		".propio/base.yaml":    "extends: open\n",
	})
	locs := profile.Locations{Workspace: ws}
	store := profile.TrustStore{Dir: state}
	load := func() *profile.Profile {
		t.Helper()
		p, err := locs.Resolve("")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	untrusted := func(step, why string) {
		t.Helper()
		err := store.Verify(load())
		if !errors.Is(err, profile.ErrUntrusted) || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: Verify = %v, want %q wrapping ErrUntrusted", step, err, why)
		}
	}
	trusted := func(step string) {
		t.Helper()
		if err := store.Verify(load()); err != nil {
			t.Errorf("%s: Verify = %v, want nil", step, err)
		}
	}
	edit := func(name, content string) {
		t.Helper()
		writeFiles(t, ws, map[string]string{name: content})
	}

	untrusted("new", ".propio/sandbox.yaml is new")
	if err := store.Trust(load()); err != nil {
		t.Fatal(err)
	}
	trusted("after trust")

	entries, err := os.ReadDir(state)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "trusted.json" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("state directory holds %q, want only trusted.json", names)
	}

	edit(".propio/sandbox.yaml", "extends: ./base.yaml\ndescription: repo\nnetwork: {mode: open}\n")
	untrusted("leaf edited", "changed since it was trusted")
	if err := store.Trust(load()); err != nil {
		t.Fatal(err)
	}
	trusted("trusted again")

	edit(".propio/base.yaml", "extends: open\nmounts: [{source: ~/.ssh, target: /ssh}]\n")
	untrusted("parent edited", "changed since it was trusted")
}

func TestTrustDoesNotDependOnTheName(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{
		".propio/sandbox.yaml": "extends: ./base.yaml\n",
		".propio/base.yaml":    "extends: open\n",
	})
	locs := profile.Locations{Workspace: ws}
	store := profile.TrustStore{Dir: t.TempDir()}
	p, err := locs.Resolve("") // `propio-sandbox trust`
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Trust(p); err != nil {
		t.Fatal(err)
	}
	// `propio-sandbox run -p /abs/.propio/sandbox.yaml`: the same files.
	p, err = locs.Resolve(filepath.Join(ws, profile.RepoProfile))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Verify(p); err != nil {
		t.Errorf("Verify of the same file named by path = %v, want nil", err)
	}
}

func TestTrustKeepsOtherProfiles(t *testing.T) {
	t.Parallel()
	store := profile.TrustStore{Dir: t.TempDir()}
	var all []*profile.Profile
	for range 2 {
		ws := t.TempDir()
		writeFiles(t, ws, map[string]string{profile.RepoProfile: "extends: open\n"})
		p, err := profile.Locations{Workspace: ws}.Resolve("")
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Trust(p); err != nil {
			t.Fatal(err)
		}
		all = append(all, p)
	}
	for _, p := range all {
		if err := store.Verify(p); err != nil {
			t.Errorf("Verify(%s) = %v after trusting another profile", p.Meta.Chain[0].Path, err)
		}
	}
}

func TestTrustStoreUnreadable(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	writeFiles(t, state, map[string]string{"trusted.json": "{not json"})
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{profile.RepoProfile: "extends: open\n"})
	p, err := profile.Locations{Workspace: ws}.Resolve("")
	if err != nil {
		t.Fatal(err)
	}
	store := profile.TrustStore{Dir: state}
	if err := store.Verify(p); err == nil || errors.Is(err, profile.ErrUntrusted) {
		t.Errorf("Verify with a corrupt store = %v, want a read error", err)
	}
	if err := store.Trust(p); err == nil {
		t.Error("Trust over a corrupt store succeeded, want an error that leaves it for the user to look at")
	}
}

func TestTrustStoreFIFO(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(state, "trusted.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{profile.RepoProfile: "extends: open\n"})
	p, err := profile.Locations{Workspace: ws}.Resolve("")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- profile.TrustStore{Dir: state}.Verify(p) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "trusted.json is a FIFO (named pipe), not a regular file") {
			t.Errorf("Verify with a FIFO for a store = %v, want it named as a FIFO", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Verify still blocks on a FIFO store after 5s")
	}
}

// TestNeedsTrustThroughALink: a repository profile named by a path through a
// link to the workspace is still one.
func TestNeedsTrustThroughALink(t *testing.T) {
	t.Parallel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(dir, "ws")
	writeFiles(t, ws, map[string]string{profile.RepoProfile: "extends: open\nunsafe: []\n"})
	if err := os.Symlink(ws, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	locs := profile.Locations{Workspace: ws}
	p, err := locs.ResolveFile(filepath.Join(dir, "link", profile.RepoProfile))
	if err != nil {
		t.Fatal(err)
	}
	if !profile.NeedsTrust(p, ws) {
		t.Errorf("NeedsTrust through a link = false, want true (chain %+v)", p.Meta.Chain)
	}
	if _, err := locs.LoadFile(filepath.Join(dir, "link", profile.RepoProfile)); err == nil || !strings.Contains(err.Error(), "a repository profile cannot name unsafe grants") {
		t.Errorf("unsafe in a repository profile named through a link: %v, want it refused", err)
	}
}

// TestTrustRecords: a record besides a profile's (a build's digest) is kept
// under a key of its own in the same trusted.json, which stays an object of
// keys to digests as older versions wrote and read it; the text it digests
// is kept beside it.
func TestTrustRecords(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	ws := t.TempDir()
	writeFiles(t, ws, map[string]string{profile.RepoProfile: "extends: open\n"})
	// A store as an older version left it.
	writeFiles(t, state, map[string]string{"trusted.json": "{\n  \"/old/repo/.propio/sandbox.yaml\": \"" + strings.Repeat("a", 64) + "\"\n}\n"})
	store := profile.TrustStore{Dir: state}
	p, err := profile.Locations{Workspace: ws}.Resolve("")
	if err != nil {
		t.Fatal(err)
	}
	text := []byte("what the build reads\n")
	sum := sha256.Sum256(text)
	rec := profile.Record{Key: "build:/ws/Dockerfile", Digest: hex.EncodeToString(sum[:]), Text: text}
	if _, _, found, err := store.Lookup(rec.Key); found || err != nil {
		t.Fatalf("Lookup before trust: found %v, %v", found, err)
	}
	if err := store.Trust(p, rec); err != nil {
		t.Fatal(err)
	}
	digest, got, found, err := store.Lookup(rec.Key)
	if err != nil || !found || digest != rec.Digest || string(got) != string(text) {
		t.Errorf("Lookup = %q, %q, %v, %v", digest, got, found, err)
	}
	if err := store.Verify(p); err != nil {
		t.Errorf("the profile trusted with the record: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(state, "trusted.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]string
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("trusted.json is no longer an object of strings: %v\n%s", err, data)
	}
	if len(m) != 3 || m["/old/repo/.propio/sandbox.yaml"] != strings.Repeat("a", 64) || m[rec.Key] != rec.Digest {
		t.Errorf("trusted.json: %v", m)
	}
	// A kept text that does not match its digest is not given back.
	if err := os.WriteFile(filepath.Join(state, "trusted-manifests", rec.Digest+".json"), []byte("forged\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, got, _, _ := store.Lookup(rec.Key); got != nil {
		t.Errorf("Lookup gave back a text that does not match its digest: %q", got)
	}
	// A record alone, without a profile.
	if err := store.Trust(nil, profile.Record{Key: "build:/other/Dockerfile", Digest: rec.Digest}); err != nil {
		t.Fatal(err)
	}
	if _, _, found, _ := store.Lookup("build:/other/Dockerfile"); !found {
		t.Error("a record trusted without a profile is not found")
	}
}

// TestNeedsTrustLinkOut: a .propio that the agent made a link to a directory
// of the user's profiles is still the repository's profile: it needs trust,
// and may not name unsafe grants.
func TestNeedsTrustLinkOut(t *testing.T) {
	t.Parallel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{"cfg/sandbox.yaml": "extends: open\nuser: root\nunsafe: [root-user]\n"})
	ws := filepath.Join(dir, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "cfg"), filepath.Join(ws, ".propio")); err != nil {
		t.Fatal(err)
	}
	locs := profile.Locations{Workspace: ws}
	p, err := locs.Resolve("")
	if err != nil {
		t.Fatal(err)
	}
	if !profile.NeedsTrust(p, ws) {
		t.Errorf("NeedsTrust through a .propio link out of the workspace = false, want true (chain %+v)", p.Meta.Chain)
	}
	if _, err := locs.Load(""); err == nil || !strings.Contains(err.Error(), "a repository profile cannot name unsafe grants") {
		t.Errorf("a user's profile reached through a link in the workspace: %v, want its unsafe refused", err)
	}
}
