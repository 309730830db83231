package hostinfo

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
)

func tree(t *testing.T, files ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		p := filepath.Join(dir, f)
		if strings.HasSuffix(f, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("secret"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestMatch(t *testing.T) {
	t.Parallel()
	ws := tree(t, ".env", ".env.prod", "a/b/.env", "a/b/key.pem", "node_modules/x/.env",
		".git/hooks/pre-commit", ".git/config", "docs/.git/config", "secrets/inner/.env", "empty/",
		".propio/sandbox.yaml", "a/.propio/x")
	p := rules(t, []string{"/.propio", ".git/hooks", ".git/config", ".env.prod"}, []string{".env", ".env.*", "*.pem", "secrets", "nothing-here"})
	got, warnings, err := Match(ws, p)
	if err != nil {
		t.Fatal(err)
	}
	want := []generator.Match{
		{Path: ".env", Hide: true},
		{Path: ".env.prod", Hide: true}, // both lists: hide wins
		{Path: ".git/config"},           // anchored: docs/.git/config is not matched
		{Path: ".git/hooks", Dir: true},
		{Path: ".propio", Dir: true},   // a leading / anchors at the root: a/.propio is not matched
		{Path: "a/b/.env", Hide: true}, // a bare name matches at any depth
		{Path: "a/b/key.pem", Hide: true},
		{Path: "node_modules/x/.env", Hide: true},
		{Path: "secrets", Dir: true, Hide: true}, // nothing below a hidden directory is listed
	}
	if !slices.Equal(got, want) || len(warnings) > 0 {
		t.Errorf("Match:\n got %+v %q\nwant %+v", got, warnings, want)
	}
}

func TestEnvNamesHoldNoValues(t *testing.T) {
	const value = "hunter2-value-never-listed"
	t.Setenv("PROPIO_TEST_SECRET", value)
	names := EnvNames()
	if !slices.Contains(names, "PROPIO_TEST_SECRET") {
		t.Fatal("the variable's name is missing")
	}
	if !slices.IsSorted(names) {
		t.Error("names are not sorted")
	}
	for _, n := range names {
		if strings.Contains(n, value) || strings.Contains(n, "=") {
			t.Fatalf("a value leaked into the names: %q", n)
		}
	}
}

func TestGather(t *testing.T) {
	ws := tree(t, ".env", "data/")
	state := filepath.Join(t.TempDir(), "state")
	t.Setenv("PROPIO_HOME", "/opt/propio")
	p := &profile.Profile{
		Workspace: profile.Workspace{Hide: []string{".env"}},
		Mounts: []profile.Mount{
			{Source: "${WORKSPACE}/data", Target: "/data"},
			{Source: "${PROPIO_HOME}/none", Target: "/none", Optional: true},
		},
	}
	h, _, err := Gather(p, ws, Dirs{State: state})
	if err != nil {
		t.Fatal(err)
	}
	if h.PropioHome != "/opt/propio" || h.Workspace != ws || h.UID != os.Getuid() {
		t.Errorf("host facts: %+v", h)
	}
	if !h.Exists[filepath.Join(ws, "data")] || h.Exists["/opt/propio/none"] {
		t.Errorf("Exists = %v", h.Exists)
	}
	st, err := os.Stat(h.EmptyFile)
	if err != nil || st.Size() != 0 || st.Mode().Perm()&0o222 != 0 {
		t.Fatalf("empty file %q: %v %v", h.EmptyFile, st, err)
	}
	// Something wrote into the empty file: the next Gather makes it empty again.
	os.Chmod(h.EmptyFile, 0o644)
	os.WriteFile(h.EmptyFile, []byte("x"), 0o644)
	if _, _, err := Gather(p, ws, Dirs{State: state}); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(h.EmptyFile); st.Size() != 0 {
		t.Error("empty file was not emptied")
	}
}

func TestPropioHomeDefaultsToInstallRoot(t *testing.T) {
	t.Setenv("PROPIO_HOME", "")
	exe, _ := os.Executable()
	exe, _ = filepath.EvalSymlinks(exe)
	if got, want := PropioHome(), filepath.Dir(filepath.Dir(exe)); got != want {
		t.Errorf("PropioHome() = %q, want %q", got, want)
	}
}

func TestExtraMounts(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "creds")
	if err := os.WriteFile(src, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	tests := map[string]struct {
		vars    map[string]string
		want    []generator.ExtraMount
		wantErr []string
	}{
		"none": {},
		"read-only by default, rw on request": {
			vars: map[string]string{EnvMounts: src + ":/a, " + dir + ":/b/:rw," + src + ":/c:ro"},
			want: []generator.ExtraMount{{Source: src, Target: "/a", ReadOnly: true}, {Source: dir, Target: "/b", ReadOnly: false}, {Source: src, Target: "/c", ReadOnly: true}},
		},
		"the unprefixed variable": {
			vars: map[string]string{EnvMountsLegacy: src + ":/a"},
			want: []generator.ExtraMount{{Source: src, Target: "/a", ReadOnly: true}},
		},
		"the prefixed variable wins": {
			vars: map[string]string{EnvMounts: src + ":/p", EnvMountsLegacy: src + ":/u"},
			want: []generator.ExtraMount{{Source: src, Target: "/p", ReadOnly: true}},
		},
		"every bad entry is named": {
			vars: map[string]string{EnvMounts: "rel/path:/a," + dir + "/missing:/b," + src + ":rel," + src + ":/d:rx," + src},
			wantErr: []string{
				`PROPIO_SANDBOX_MOUNTS: "rel/path:/a": the source is relative; write an absolute path`,
				`PROPIO_SANDBOX_MOUNTS: "` + dir + `/missing:/b": the source does not exist (it is never created)`,
				`PROPIO_SANDBOX_MOUNTS: "` + src + `:rel": the target is relative; write an absolute path inside the sandbox`,
				`PROPIO_SANDBOX_MOUNTS: "` + src + `:/d:rx": mode "rx" is neither ro nor rw`,
				`PROPIO_SANDBOX_MOUNTS: "` + src + `": want SRC:DST or SRC:DST:ro|rw`,
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ExtraMounts(env(tc.vars))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, got %v", got)
				}
				if msg := err.Error(); msg != strings.Join(tc.wantErr, "\n") {
					t.Fatalf("error:\n%s\nwant:\n%s", msg, strings.Join(tc.wantErr, "\n"))
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// PROPIO_SANDBOX_TEST_DISK is read from the launcher's environment only: a
// size of 1m or more, else an error naming the variable.
func TestTestDisk(t *testing.T) {
	for name, tc := range map[string]struct {
		env     map[string]string
		want    int64
		wantErr bool
	}{
		"unset":    {nil, 0, false},
		"empty":    {map[string]string{EnvTestDisk: ""}, 0, false},
		"set":      {map[string]string{EnvTestDisk: "200m"}, 200 << 20, false},
		"too low":  {map[string]string{EnvTestDisk: "10k"}, 0, true},
		"not size": {map[string]string{EnvTestDisk: "lots"}, 0, true},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := TestDisk(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("TestDisk = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), EnvTestDisk) {
				t.Errorf("the error does not name the variable: %v", err)
			}
		})
	}
}

// A profile cannot set the test cap: env.set is the sandbox's environment,
// and Gather reads the variable from the launcher's only.
func TestTestDiskNotFromProfile(t *testing.T) {
	ws := t.TempDir()
	t.Setenv(EnvTestDisk, "")
	p := &profile.Profile{Env: profile.Env{Set: map[string]string{EnvTestDisk: "1m"}}}
	h, _, err := Gather(p, ws, Dirs{State: filepath.Join(t.TempDir(), "state")})
	if err != nil {
		t.Fatal(err)
	}
	if h.TestDisk != 0 {
		t.Errorf("env.set %s=1m in a profile set the test cap to %d", EnvTestDisk, h.TestDisk)
	}
	t.Setenv(EnvTestDisk, "200m")
	if h, _, err = Gather(p, ws, Dirs{State: filepath.Join(t.TempDir(), "state")}); err != nil || h.TestDisk != 200<<20 {
		t.Errorf("the launcher's %s=200m: %d, %v", EnvTestDisk, h.TestDisk, err)
	}
}
