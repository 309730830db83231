package e2e

// Each built-in preflight check made to fail for real: run exits 3, names
// the check, and creates no container and no network. doctor runs every
// check, and its --json output matches schema/doctor.schema.json.

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/schema"
)

// preflightRefused checks that r is run's refusal by the check name, with a
// hint, and that nothing of s's workspace exists on the engine.
func preflightRefused(t *testing.T, s *sandbox, r Result, check, inReason string) {
	t.Helper()
	if r.Code != 3 {
		t.Errorf("want exit 3:\n%s", r)
	}
	m := errorsParse(r.Stderr)
	want := "preflight check " + check + " failed: "
	if len(m.errors) == 0 || !strings.HasPrefix(m.errors[0], want) || !strings.Contains(m.errors[0], inReason) {
		t.Errorf("want the first error line to start %q and say %q:\n%s", want, inReason, r)
	}
	if len(m.hints) == 0 {
		t.Errorf("no hint:\n%s", r)
	}
	if r.Stdout != "" {
		t.Errorf("the sandbox's command ran:\n%s", r)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("a refused run created %v", left)
	}
}

func TestPreflightFails(t *testing.T) {
	t.Parallel()

	t.Run("engine", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile(probeOffline)
		// A socket file with nothing listening, as a stopped engine leaves.
		path := filepath.Join(errorsSocketDir(t), "stopped.sock")
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		env := s.Env
		s.Env = append(append([]string(nil), env...), "DOCKER_HOST=unix://"+path)
		r := s.Run("", "run", "-p", p, "--", "echo", "ran")
		s.Env = env
		preflightRefused(t, s, r, "engine", "not running")
	})

	t.Run("image", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile("image: propio-sandbox-e2e/does-not-exist:" + randomID() + "\n" + probeOffline)
		preflightRefused(t, s, probeRun(s, p, "echo", "ran"), "image", "is not on the engine")
	})

	t.Run("workspace /", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile(probeOffline)
		root := *s
		root.Workspace = "/"
		preflightRefused(t, &root, probeRun(&root, p, "echo", "ran"), "workspace", "the workspace is /")
	})

	t.Run("mounts", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		missing := filepath.Join(t.TempDir(), "gone")
		p := s.Profile(probeOffline + "mounts: [{source: " + missing + ", target: /data}]\n")
		preflightRefused(t, s, probeRun(s, p, "echo", "ran"), "mounts", missing+" does not exist")
		if _, err := os.Stat(missing); err == nil {
			t.Errorf("the missing mount source was created")
		}
	})

	t.Run("env.required", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile(probeOffline + "env: {pass: [E2E_PREFLIGHT_VAR], required: [E2E_PREFLIGHT_VAR]}\n")
		preflightRefused(t, s, probeRun(s, p, "echo", "ran"), "env.required", "E2E_PREFLIGHT_VAR")
	})

	t.Run("ports", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		p := s.Profile("network: {mode: open}\nports: [\"" + port + ":80\"]\n")
		preflightRefused(t, s, probeRun(s, p, "echo", "ran"), "ports", "127.0.0.1:"+port+"/tcp")
	})

	t.Run("trust", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		dir := filepath.Join(s.Workspace, ".propio")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "sandbox.yaml"), []byte("image: "+ProbeImage+"\n"+probeOffline), 0o644); err != nil {
			t.Fatal(err)
		}
		preflightRefused(t, s, s.Run("", "run", "--", "echo", "ran"), "trust", "sandbox.yaml")
	})

	t.Run("runtime", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		p := s.Profile(probeOffline + "security: {runtime: propio-no-such-runtime}\n")
		preflightRefused(t, s, probeRun(s, p, "echo", "ran"), "runtime", `no runtime "propio-no-such-runtime"`)
	})
}

// TestPreflightDoctor: doctor passes every check for a profile that can run,
// prints them all when some fail, and its JSON matches the schema.
func TestPreflightDoctor(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	good := s.Profile(probeOffline)
	bad := s.Profile(probeOffline + "security: {runtime: propio-no-such-runtime}\nenv: {pass: [E2E_PREFLIGHT_VAR], required: [E2E_PREFLIGHT_VAR]}\n")

	for _, tc := range []struct {
		profile string
		code    int
		failed  []string
	}{
		{good, 0, nil},
		{bad, 1, []string{"env.required", "runtime"}},
	} {
		r := s.Run("", "doctor", "-p", tc.profile, "--json")
		if r.Code != tc.code || r.Stderr != "" {
			t.Errorf("want exit %d and nothing on stderr:\n%s", tc.code, r)
		}
		var doc any
		if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
			t.Fatalf("doctor --json: %v\n%s", err, r)
		}
		v, err := schema.ValidateDoctor(doc)
		if err != nil || len(v) > 0 {
			t.Errorf("doctor --json does not match the schema: %v %+v\n%s", err, v, r.Stdout)
		}
		var rep struct {
			OK     bool
			Checks []struct {
				Name string
				OK   bool
			}
		}
		json.Unmarshal([]byte(r.Stdout), &rep)
		var failed []string
		for _, c := range rep.Checks {
			if !c.OK {
				failed = append(failed, c.Name)
			}
		}
		if len(rep.Checks) != len(profile.BuiltinChecks) || rep.OK != (tc.code == 0) || strings.Join(failed, ",") != strings.Join(tc.failed, ",") {
			t.Errorf("want all %d built-in checks with %v failed:\n%s", len(profile.BuiltinChecks), tc.failed, r.Stdout)
		}

		r = s.Run("", "doctor", "-p", tc.profile)
		if r.Code != tc.code || !strings.HasPrefix(r.Stdout, "NAME ") {
			t.Errorf("want the table and exit %d:\n%s", tc.code, r)
		}
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("doctor created %v", left)
	}
}
