package generator_test

import (
	"bytes"
	"context"
	"flag"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/profiles"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// repoRoot is the module root; it is replaced by /REPO in goldens so that
// they hold no machine-specific path.
var repoRoot, _ = filepath.Abs("..")

var limits = profile.Limits{CPUs: 4, Memory: 8 << 30}

const project = "propio-project"

// fixtureHost is a fixed machine: goldens must not depend on the one running
// the tests.
func fixtureHost(t *testing.T, p *profile.Profile) generator.Host {
	t.Helper()
	h := generator.Host{
		Workspace:   "/home/dev/project",
		Home:        "/home/dev",
		PropioHome:  "/opt/propio-sandbox",
		UID:         1000,
		GID:         1000,
		EnvNames:    []string{"ANTHROPIC_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HOME", "OPENROUTER_API_KEY", "PATH", "PIP_INDEX_URL", "TERM"},
		EmptyFile:   "/home/dev/.local/state/propio-sandbox/empty",
		LogDir:      "/home/dev/.local/state/propio-sandbox/logs",
		ResolvDir:   "/home/dev/.local/state/propio-sandbox/resolv",
		AskDir:      "/run/user/1000/propio-sandbox/ask",
		BrokerDir:   "/run/user/1000/propio-sandbox/broker",
		CADir:       "/run/user/1000/propio-sandbox/ca",
		SystemRoots: "/etc/ssl/certs/ca-certificates.crt",
		AgentDir:    "/run/user/1000/propio-sandbox/agent",
		GitConfig:   []string{"/home/dev/.config/git/config", "/home/dev/.gitconfig"},
		KnownHosts:  "/home/dev/.ssh/known_hosts",
		Passwd:      "/home/dev/.local/state/propio-sandbox/accounts/1000-1000.passwd",
		Group:       "/home/dev/.local/state/propio-sandbox/accounts/1000-1000.group",
		Exists:      map[string]bool{},
	}
	// The launcher forwards an agent when the profile asks (the fixture host
	// has one running).
	if p.SSHAgent != "off" {
		h.SSHAgent = generator.SSHAgent{Source: "/run/user/1000/ssh-agent.sock"}
	}
	// The workspace's readonly and hide matches come from a real tree, matched
	// by the code that matches real workspaces.
	ws := fixtureWorkspace(t)
	matches, warnings, err := hostinfo.Match(ws, p)
	if err != nil || len(warnings) > 0 {
		t.Fatal(err, warnings)
	}
	h.Matches = matches
	// And so does the guard's scan of its git directory.
	scanned := h
	scanned.Workspace = ws
	hostinfo.Guard(p, &scanned)
	h.Guard = scanned.Guard
	for _, m := range p.Mounts {
		if src := generator.MountSource(m, h); !strings.Contains(src, "missing") {
			h.Exists[src] = true
		}
	}
	// The user's grants for the workspace, when the case says it has some.
	if strings.Contains(p.Description, "grants") {
		h.GrantsFile = "/home/dev/.config/propio-sandbox/grants/project-0123456789ab.yaml"
		h.Grants = []generator.Grant{{N: 1, Rule: "files.pythonhosted.org:443"}, {N: 2, Deny: true, Rule: "pypi.org"}, {N: 3, Rule: "*.example.test:8080"}}
	}
	// A launch in changeset mode has a changeset (its description says how
	// the test case realises it).
	if p.Changeset() && !strings.Contains(p.Description, "none") {
		cs := &generator.Changeset{ID: "20261122-064500-3f9a", Mode: generator.ChangesetOverlay, UserXattr: true}
		if strings.Contains(p.Description, "copy") {
			cs.Mode = generator.ChangesetCopy
		}
		for _, m := range generator.ChangesetMounts(p, h) {
			dir := "/home/dev/.local/state/propio-sandbox/changesets/" + cs.ID + "/" + m.Name
			if cs.Mode == generator.ChangesetOverlay {
				m.UpperDir, m.WorkDir = dir+"/upper", dir+"/work"
			} else {
				m.CopyIn, m.CopyOut = m.Source, dir+"/tree"
			}
			cs.Mounts = append(cs.Mounts, m)
		}
		h.Changeset = cs
	}
	return h
}

// fixtureWorkspace makes a workspace with the files the built-in patterns
// and the test profiles care about.
func fixtureWorkspace(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{
		".env", ".env.local", ".git/config", ".git/hooks/pre-commit", ".propio/sandbox.yaml",
		"certs/server.pem", "src/main.go", "src/.env", "secrets/token", ".venv/bin/python",
	} {
		path := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

type goldenCase struct {
	name string
	load func() (*profile.Profile, error)
	dir  string // testdata directory holding compose.golden.yaml
}

// cases are every built-in profile, every example, and the hand-made cases
// in testdata/<case>/profile.yaml.
func cases(t *testing.T) []goldenCase {
	t.Helper()
	locs := profile.Locations{}
	var out []goldenCase
	for _, name := range profiles.Names() {
		out = append(out, goldenCase{
			name: "builtin-" + name,
			load: func() (*profile.Profile, error) { return locs.Load(name) },
		})
	}
	err := filepath.WalkDir("../examples", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		slug := strings.NewReplacer("../examples/", "", "/", "-", ".yaml", "").Replace(path)
		out = append(out, goldenCase{
			name: "example-" + strings.ReplaceAll(slug, ".propio-", ""),
			load: func() (*profile.Profile, error) { return locs.Load(path) },
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	custom, _ := filepath.Glob("testdata/*/profile.yaml")
	for _, path := range custom {
		out = append(out, goldenCase{
			name: filepath.Base(filepath.Dir(path)),
			load: func() (*profile.Profile, error) { return locs.Load(path) },
		})
	}
	for i := range out {
		out[i].dir = filepath.Join("testdata", out[i].name)
	}
	return out
}

// caseOptions are the options a case is generated with: a persistent
// sandbox's (up) when its description says so.
func caseOptions(p *profile.Profile) generator.Options {
	o := generator.Options{Project: project}
	if strings.Contains(p.Description, "persistent") {
		o.Keep = &generator.Keep{Binary: "/opt/propio-sandbox/bin/propio-sandbox", Idle: p.Resources.Idle.Duration()}
	}
	return o
}

func render(t *testing.T, c goldenCase) (*types.Project, []byte) {
	t.Helper()
	p, err := c.load()
	if err != nil {
		t.Fatalf("loading: %v", err)
	}
	proj, err := generator.Generate(p, fixtureHost(t, p), caseOptions(p))
	if err != nil {
		t.Fatalf("generating: %v", err)
	}
	out, err := generator.Render(proj)
	if err != nil {
		t.Fatalf("rendering: %v", err)
	}
	return proj, out
}

func TestGolden(t *testing.T) {
	for _, c := range cases(t) {
		t.Run(c.name, func(t *testing.T) {
			_, out := render(t, c)
			out = bytes.ReplaceAll(out, []byte(repoRoot), []byte("/REPO"))
			golden := filepath.Join(c.dir, "compose.golden.yaml")
			if *update {
				if err := os.MkdirAll(c.dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./generator -update to create it)", err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("render differs from %s (go test ./generator -update rewrites it):\n%s", golden, diff(string(want), string(out)))
			}
		})
	}
}

// TestRoundTrip loads the rendered YAML with compose-go's own loader, with
// interpolation on, and checks that it is the same project: rendering the
// loaded project gives the same bytes.
func TestRoundTrip(t *testing.T) {
	for _, c := range cases(t) {
		t.Run(c.name, func(t *testing.T) {
			proj, out := render(t, c)
			loaded, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
				WorkingDir:  proj.WorkingDir,
				ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: out}},
				Environment: types.Mapping{},
			}, func(o *loader.Options) {
				o.SetProjectName(project, true)
				o.SkipConsistencyCheck = false
			})
			if err != nil {
				t.Fatalf("compose-go cannot load the rendered project: %v\n%s", err, out)
			}
			again, err := generator.Render(loaded)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, out) {
				t.Errorf("loading the render back changed it:\n%s", diff(string(out), string(again)))
			}
		})
	}
}

func TestRenderIsDeterministic(t *testing.T) {
	for _, c := range cases(t) {
		t.Run(c.name, func(t *testing.T) {
			_, first := render(t, c)
			p, err := c.load()
			if err != nil {
				t.Fatal(err)
			}
			h := fixtureHost(t, p)
			// The same facts in another order give the same bytes.
			slices.Reverse(h.EnvNames)
			slices.Reverse(h.Matches)
			proj, err := generator.Generate(p, h, caseOptions(p))
			if err != nil {
				t.Fatal(err)
			}
			second, err := generator.Render(proj)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first, second) {
				t.Errorf("second render differs:\n%s", diff(string(first), string(second)))
			}
		})
	}
}

// TestSecretsNeverRendered runs the real host path: values in the process
// environment must not reach the project, only names.
func TestSecretsNeverRendered(t *testing.T) {
	const secret = "sk-or-v1-4242-do-not-print-me"
	t.Setenv("OPENROUTER_API_KEY", secret)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret+"-aws")
	t.Setenv("OLLAMA_HOST", secret+"-ollama") // passed host value wins over env.set, by name only
	p, err := profile.Locations{}.Load("../examples/node-agent/.propio/sandbox.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p.Env.Pass = append(p.Env.Pass, "OLLAMA_HOST")
	ws := fixtureWorkspace(t)
	h, _, err := hostinfo.Gather(p, ws, hostinfo.Dirs{State: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	proj, err := generator.Generate(p, h, generator.Options{Project: project})
	if err != nil {
		t.Fatal(err)
	}
	out, err := generator.Render(proj)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(secret)) {
		t.Fatalf("a secret value was rendered:\n%s", out)
	}
	env := proj.Services[generator.Service].Environment
	for _, name := range []string{"OPENROUTER_API_KEY", "AWS_SECRET_ACCESS_KEY", "OLLAMA_HOST"} {
		v, ok := env[name]
		if !ok || v != nil {
			t.Errorf("%s: want passed by name (present, no value), got present=%v value=%v", name, ok, v)
		}
	}
}

// A missing optional mount is left out; a missing required one is in the
// project all the same (preflight refuses to run without it, and render
// does not depend on what the host has).
func TestMissingMountSource(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	body := "image: x\nmounts:\n  - {source: /does/not/exist, target: /data}\n  - {source: /also/missing, target: /opt, optional: true}\n"
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Locations{}.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	h := generator.Host{Workspace: "/w", Exists: map[string]bool{}}
	proj, err := generator.Generate(p, h, generator.Options{Project: project})
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, v := range proj.Services[generator.Service].Volumes {
		targets = append(targets, v.Source+":"+v.Target)
	}
	if !slices.Contains(targets, "/does/not/exist:/data") || slices.Contains(targets, "/also/missing:/opt") {
		t.Errorf("volumes %q: want the required mount, and not the optional one", targets)
	}
}

// diff shows the first differing lines, enough to see what changed.
func diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 20; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl + "\n")
			shown++
		}
	}
	return b.String()
}

func TestPickSubnet(t *testing.T) {
	first, err := generator.PickSubnet("propio-a-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := netip.MustParsePrefix("198.18.0.0/15")
	if first.Bits() != 24 || !pool.Contains(first.Addr()) {
		t.Fatalf("subnet %s is not a /24 of %s", first, pool)
	}
	if again, _ := generator.PickSubnet("propio-a-1", nil); again != first {
		t.Fatalf("same project, different subnets: %s, %s", first, again)
	}
	// Taken by a network of the engine (even a wider one): the next is chosen.
	wide := netip.PrefixFrom(first.Addr(), 20).Masked()
	next, err := generator.PickSubnet("propio-a-1", []netip.Prefix{wide, netip.MustParsePrefix("172.17.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	if next.Overlaps(wide) || !pool.Contains(next.Addr()) {
		t.Fatalf("subnet %s overlaps %s, or is outside the pool", next, wide)
	}
	// The whole pool taken: an error, not an overlapping network.
	if s, err := generator.PickSubnet("propio-a-1", []netip.Prefix{pool}); err == nil {
		t.Fatalf("full pool gave %s", s)
	}
	if gw := generator.GatewayAddr(netip.MustParsePrefix("198.18.7.0/24")); gw != netip.MustParseAddr("198.18.7.2") {
		t.Fatalf("gateway address %s", gw)
	}
	// The engine numbers containers from the second quarter, above the
	// gateway's address; the gateway's virtual addresses are the upper half.
	s := netip.MustParsePrefix("198.18.7.0/24")
	if c, v := generator.ContainerRange(s), generator.VirtualRange(s); c.String() != "198.18.7.64/26" || c.Contains(generator.GatewayAddr(s)) || v.String() != "198.18.7.128/25" {
		t.Fatalf("container range %s, virtual range %s", c, v)
	}
}

func TestAllowlistOutsideNetwork(t *testing.T) {
	p, err := profile.Locations{}.Load(filepath.Join("testdata", "allowlist", "profile.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	h := fixtureHost(t, p)
	subnet := netip.MustParsePrefix("198.19.3.0/24")
	project, err := generator.Generate(p, h, generator.Options{Project: project, GatewayImage: "propio-sandbox/gateway:0123", Subnet: subnet, OutsideNetwork: "corp-egress"})
	if err != nil {
		t.Fatal(err)
	}
	out := project.Networks[generator.OutsideNetwork]
	if !bool(out.External) || out.Name != "corp-egress" {
		t.Errorf("outside network = %+v, want the external network corp-egress", out)
	}
	gw := project.Services[generator.GatewayService]
	if gw.Image != "propio-sandbox/gateway:0123" || gw.Networks[generator.SandboxNetwork].Ipv4Address != "198.19.3.2" {
		t.Errorf("gateway image %s, address %s", gw.Image, gw.Networks[generator.SandboxNetwork].Ipv4Address)
	}
	agent := project.Services[generator.Service]
	if v := agent.Environment["HTTP_PROXY"]; v == nil || *v != "http://198.19.3.2:3128" {
		t.Errorf("agent HTTP_PROXY = %v: the profile's own value must not replace the gateway's", v)
	}
	if _, onSandbox := agent.Networks[generator.SandboxNetwork]; len(agent.Networks) != 1 || !onSandbox {
		t.Errorf("agent networks = %v, want only the sandbox network", agent.Networks)
	}
}

// TestAllowlistJoin: the gateway joins the networks of network.join, which
// the project takes as they are (external); the agent stays on the sandbox
// network alone, so only what the rules allow of them is reachable.
func TestAllowlistJoin(t *testing.T) {
	p, err := profile.Locations{}.Load(filepath.Join("testdata", "allowlist-join", "profile.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	project, err := generator.Generate(p, fixtureHost(t, p), generator.Options{Project: project})
	if err != nil {
		t.Fatal(err)
	}
	gw := project.Services[generator.GatewayService]
	for _, name := range []string{"ollama-net", "models.local"} {
		key := generator.JoinedNetwork(name)
		if n := project.Networks[key]; !bool(n.External) || n.Name != name {
			t.Errorf("network %s = %+v, want the external network %s", key, n, name)
		}
		if _, on := gw.Networks[key]; !on {
			t.Errorf("gateway networks = %v, want %s among them", gw.Networks, key)
		}
	}
	agent := project.Services[generator.Service]
	if _, onSandbox := agent.Networks[generator.SandboxNetwork]; len(agent.Networks) != 1 || !onSandbox {
		t.Errorf("agent networks = %v, want only the sandbox network", agent.Networks)
	}
}

// TestAllowlistFencedNetns: on an engine whose internal networks do not
// keep the host out (Podman), the agent joins the network namespace of a
// container of its own on the sandbox network alone, which fences it in
// with CAP_NET_ADMIN and nothing else; the agent has no network, DNS or
// port of its own (the namespace's are its holder's).
func TestAllowlistFencedNetns(t *testing.T) {
	p, err := profile.Locations{}.Load(filepath.Join("testdata", "allowlist", "profile.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	h := fixtureHost(t, p)
	h.Engine = generator.EngineFacts{TmpfsU: true, TmpfsCopyUp: true, NamesHost: true, UserSpaceGateway: true, FencedNetns: true} // rootful Podman's
	subnet := netip.MustParsePrefix("198.19.3.0/24")
	proj, err := generator.Generate(p, h, generator.Options{Project: project, GatewayImage: "propio-sandbox/gateway:0123", Subnet: subnet})
	if err != nil {
		t.Fatal(err)
	}
	agent := proj.Services[generator.Service]
	if agent.NetworkMode != "service:"+generator.NetnsService || len(agent.Networks) != 0 || len(agent.DNS) != 0 || len(agent.Ports) != 0 {
		t.Errorf("agent: network_mode %q, networks %v, dns %v, ports %v; want only the netns service's namespace", agent.NetworkMode, agent.Networks, agent.DNS, agent.Ports)
	}
	if _, ok := agent.DependsOn[generator.NetnsService]; !ok {
		t.Errorf("agent depends on %v, want the netns service among them", agent.DependsOn)
	}
	n, ok := proj.Services[generator.NetnsService]
	if !ok {
		t.Fatal("no netns service")
	}
	if want := []string{"netns-fence", "--gateway", "198.19.3.2"}; !slices.Equal(n.Command, want) || n.Image != "propio-sandbox/gateway:0123" {
		t.Errorf("netns: image %s, command %q; want the gateway's image, %q", n.Image, n.Command, want)
	}
	if _, onSandbox := n.Networks[generator.SandboxNetwork]; len(n.Networks) != 1 || !onSandbox {
		t.Errorf("netns networks = %v, want only the sandbox network", n.Networks)
	}
	if !slices.Equal(n.CapDrop, []string{"ALL"}) || !slices.Equal(n.CapAdd, []string{"NET_ADMIN"}) || !n.ReadOnly || !slices.Contains(n.SecurityOpt, "no-new-privileges:true") || n.Privileged {
		t.Errorf("netns: cap_drop %v cap_add %v read_only %v security_opt %v privileged %v", n.CapDrop, n.CapAdd, n.ReadOnly, n.SecurityOpt, n.Privileged)
	}
	if !slices.Equal(n.DNS, types.StringList{"198.19.3.2"}) {
		t.Errorf("netns dns = %v, want the gateway's", n.DNS)
	}
	if _, err := generator.Render(proj); err != nil {
		t.Errorf("render: %v", err)
	}
	h.Engine.FencedNetns = false
	proj, err = generator.Generate(p, h, generator.Options{Project: project, Subnet: subnet})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := proj.Services[generator.NetnsService]; ok {
		t.Error("a netns service where internal networks keep the host out")
	}
}

// TestAllowlistFencedNetnsRootless: on a rootless Podman (keep-id), the
// holder of the agent's network namespace maps the user to itself, and the
// agent runs in the holder's user namespace (a container of another user
// namespace cannot join a rootless engine's namespace of one: its runtime
// may not mount /sys there), found by the name Compose gives the holder's
// container. An agent that is not the user (user: root) keeps the engine's
// own user namespace, and so does the holder.
func TestAllowlistFencedNetnsRootless(t *testing.T) {
	p, err := profile.Locations{}.Load(filepath.Join("testdata", "allowlist", "profile.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	h := fixtureHost(t, p)
	h.Engine = generator.EngineFacts{TmpfsU: true, TmpfsCopyUp: true, NamesHost: true, KeepID: true, UserSpaceGateway: true, FencedNetns: true} // rootless Podman's
	opts := generator.Options{Project: project, GatewayImage: "propio-sandbox/gateway:0123", Subnet: netip.MustParsePrefix("198.19.3.0/24")}
	proj, err := generator.Generate(p, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	agent, n, gw := proj.Services[generator.Service], proj.Services[generator.NetnsService], proj.Services[generator.GatewayService]
	if want := "container:" + project + "-netns-1"; agent.UserNSMode != want || n.UserNSMode != "keep-id" || gw.UserNSMode != "keep-id" {
		t.Errorf("userns_mode: agent %q, netns %q, gateway %q; want %q, keep-id, keep-id", agent.UserNSMode, n.UserNSMode, gw.UserNSMode, want)
	}
	if agent.User != "1000:1000" || n.User != "0:0" || !slices.Equal(n.CapAdd, []string{"NET_ADMIN"}) || len(agent.CapAdd) != 0 {
		t.Errorf("users: agent %q (cap_add %v), netns %q (cap_add %v); want the user's without capabilities, root with NET_ADMIN alone", agent.User, agent.CapAdd, n.User, n.CapAdd)
	}
	if want := []string{"netns-fence", "--gateway", "198.19.3.2"}; !slices.Equal(n.Command, want) {
		t.Errorf("netns command %q, want %q: a gateway relaying in user space has no virtual addresses", n.Command, want)
	}
	if _, err := generator.Render(proj); err != nil {
		t.Errorf("render: %v", err)
	}
	p.User = profile.RootUser()
	proj, err = generator.Generate(p, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	if a, n := proj.Services[generator.Service].UserNSMode, proj.Services[generator.NetnsService].UserNSMode; a != "" || n != "" {
		t.Errorf("user root: userns_mode agent %q, netns %q; want the engine's own for both", a, n)
	}
}

func TestRootlessPodmanKeepsTheUsersID(t *testing.T) {
	p, err := profile.Locations{}.Load("strict")
	if err != nil {
		t.Fatal(err)
	}
	h := fixtureHost(t, p)
	for _, keep := range []bool{false, true} {
		h.Engine.KeepID = keep
		proj, err := generator.Generate(p, h, generator.Options{Project: project})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{generator.Service, generator.GatewayService} {
			want := ""
			if keep {
				want = "keep-id"
			}
			if got := proj.Services[name].UserNSMode; got != want {
				t.Errorf("KeepID=%v: %s has userns_mode %q, want %q", keep, name, got, want)
			}
		}
	}
}

func TestPodmanOptions(t *testing.T) {
	p, err := profile.Locations{}.Load("open")
	if err != nil {
		t.Fatal(err)
	}
	h := fixtureHost(t, p)
	h.Engine = generator.EngineFacts{TmpfsU: true, TmpfsCopyUp: true, NamesHost: true, UserSpaceGateway: true} // Podman's
	h.Matches = append(h.Matches, generator.Match{Path: "secrets", Dir: true, Hide: true})
	proj, err := generator.Generate(p, h, generator.Options{Project: project})
	if err != nil {
		t.Fatal(err)
	}
	svc := proj.Services[generator.Service]
	want := types.StringList{
		"/tmp:size=1073741824,mode=1777,notmpcopyup",
		"/home/sandbox:size=1073741824,mode=0700,U,notmpcopyup",
		"/workspace/secrets:ro,size=4k,mode=0555,notmpcopyup",
	}
	if !slices.Equal(svc.Tmpfs, want) {
		t.Errorf("tmpfs on Podman:\n%q\nwant:\n%q", svc.Tmpfs, want)
	}
	if len(svc.ExtraHosts) != 0 {
		t.Errorf("extra_hosts on Podman %v: Podman 4.3 has no host-gateway", svc.ExtraHosts)
	}
}

// The disk cap is in the extension, where the engine reads it back (from the
// project in memory, or from a render loaded again), and sizes /tmp and
// HOME: each is the smaller of resources.tmp and the cap. A test's lower cap
// (PROPIO_SANDBOX_TEST_DISK) lowers both, and never raises them.
func TestDiskCap(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(path, []byte("image: a\nresources: {tmp: 3g, disk: 2g}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Locations{}.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		testDisk, want int64
	}{
		"profile":           {0, 2 << 30},
		"test cap lowers":   {300 << 20, 300 << 20},
		"test cap no raise": {20 << 30, 2 << 30},
	} {
		t.Run(name, func(t *testing.T) {
			h := fixtureHost(t, p)
			h.TestDisk = tc.testDisk
			proj, err := generator.Generate(p, h, generator.Options{Project: project})
			if err != nil {
				t.Fatal(err)
			}
			svc := proj.Services[generator.Service]
			if got := generator.DiskCap(svc); got != tc.want {
				t.Errorf("cap in the extension %d, want %d", got, tc.want)
			}
			wantTmpfs := types.StringList{
				"/tmp:size=" + strconv.FormatInt(tc.want, 10) + ",mode=1777",
				"/home/sandbox:size=" + strconv.FormatInt(tc.want, 10) + ",mode=0700,uid=1000,gid=1000",
			}
			if !slices.Equal(svc.Tmpfs, wantTmpfs) {
				t.Errorf("tmpfs %q, want %q", svc.Tmpfs, wantTmpfs)
			}
			out, err := generator.Render(proj)
			if err != nil {
				t.Fatal(err)
			}
			loaded, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
				WorkingDir:  proj.WorkingDir,
				ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: out}},
				Environment: types.Mapping{},
			}, func(o *loader.Options) { o.SetProjectName(project, true) })
			if err != nil {
				t.Fatal(err)
			}
			if got := generator.DiskCap(loaded.Services[generator.Service]); got != tc.want {
				t.Errorf("cap read back from the render %d, want %d", got, tc.want)
			}
		})
	}
}
