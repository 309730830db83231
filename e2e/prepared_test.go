package e2e

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestPreparedGateway: once an allowlist sandbox runs, the next run's
// gateway is prepared ahead (ls: prepared), on a network of its own that
// no sandbox has been on; the next run adopts it, creating no gateway, and
// is held to the allowlist by it as a cold run is; the gateway goes with
// that run (never serving another), the log is that run's, and the one
// after gets a new one. A prepared gateway that is not what a run makes
// (the profile changed) is removed, and the run goes cold.
func TestPreparedGateway(t *testing.T) {
	s := newSandbox(t)
	if testenv.EnginePodman(t) {
		t.Skip("no gateway is prepared ahead on Podman: its internal networks do not keep the host out, and a fenced sandbox's namespace is made with its run")
	}
	s.uniqueWorkspace()
	// The internet first: its cleanup runs after gc --prepared has removed
	// the gateway prepared on it.
	in := newInternet(t)
	s.Prepared()
	s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")

	r := s.Run("", "run", "-p", p, "--", "fetch", "http://allowed.test/one")
	if r.Code != 0 || !strings.Contains(r.Stdout, "alpha http allowed.test /one") {
		t.Fatalf("the first run:\n%s", r)
	}
	s.WaitBackground()
	first := preparedGateways(t, s)
	if len(first) != 1 {
		t.Fatalf("prepared gateways after the first run: %v, want one", first)
	}
	if states := sandboxStates(t, s); !slices.Equal(states, []string{"prepared"}) {
		t.Errorf("ls shows the workspace's sandboxes %v, want one prepared", states)
	}
	gw := first[0]
	if on := networkMembers(t, gw.project+"_sandbox"); !slices.Equal(on, []string{gw.name}) {
		t.Errorf("the prepared gateway's network holds %v, want the gateway alone", on)
	}

	l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	l.waitStdout(t, "ready", time.Minute)
	agent, project := agentOf(t, s)
	if project != gw.project {
		t.Fatalf("the run is sandbox %s, want the prepared %s", project, gw.project)
	}
	if gws := gatewaysOf(t, project); !slices.Equal(gws, []string{gw.name}) {
		t.Errorf("the run's gateways %v, want the prepared one alone", gws)
	}
	agentName := strings.TrimSpace(mustDocker(t, "inspect", "-f", "{{.Name}}", agent))
	if on := networkMembers(t, project+"_sandbox"); !slices.Equal(on, sortedOf(gw.name, strings.TrimPrefix(agentName, "/"))) {
		t.Errorf("the sandbox network holds %v, want the gateway and the run's agent", on)
	}
	if out, err := docker("exec", agent, "/probe", "fetch", "http://allowed.test/two"); err != nil || !strings.Contains(out, "alpha http allowed.test /two") {
		t.Errorf("an allowed name through the adopted gateway: %v\n%s", err, out)
	}
	if out, _ := docker("exec", agent, "/probe", "fetch", "http://denied.test/"); !strings.Contains(out, "status 403") {
		t.Errorf("a denied name through the adopted gateway:\n%s", out)
	}
	l.signal(t, syscall.SIGTERM)
	l.wait(t, time.Minute)
	s.WaitBackground()
	if out, _ := docker("ps", "-aq", "--filter", "name=^"+gw.name+"$"); strings.TrimSpace(out) != "" {
		t.Errorf("the adopted gateway outlived its run")
	}
	next := preparedGateways(t, s)
	if len(next) != 1 || next[0].id == gw.id || next[0].project == project {
		t.Errorf("prepared after the adopted run: %v, want one new gateway", next)
	}
	var hosts []string
	for _, e := range decisions(t, s, false) {
		hosts = append(hosts, e["host"].(string))
	}
	if !slices.Contains(hosts, "allowed.test") || !slices.Contains(hosts, "denied.test") {
		t.Errorf("logs shows %v, want the adopted run's decisions", hosts)
	}

	changed := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test, tcp.test]\n")
	r = s.Run("", "run", "-p", changed, "--", "fetch", "http://allowed.test/three")
	if r.Code != 0 || !strings.Contains(r.Stdout, "alpha http allowed.test /three") {
		t.Fatalf("a run of another profile:\n%s", r)
	}
	s.WaitBackground()
	last := preparedGateways(t, s)
	if len(last) != 1 || last[0].id == next[0].id {
		t.Errorf("prepared after a run of another profile: %v, want one, not the stale %v", last, next[0])
	}
}

// TestPreparedAdopterKilled: the launcher of a run on a prepared gateway
// is killed; the gateway's keeper removes the sandbox with its gateway,
// without gc.
func TestPreparedAdopterKilled(t *testing.T) {
	s := newSandbox(t)
	if testenv.EnginePodman(t) {
		t.Skip("no gateway is prepared ahead on Podman: its internal networks do not keep the host out, and a fenced sandbox's namespace is made with its run")
	}
	s.uniqueWorkspace()
	s.Prepared()
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")
	if r := s.Run("", "run", "-p", p, "--", "exit", "0"); r.Code != 0 {
		t.Fatalf("the first run:\n%s", r)
	}
	s.WaitBackground()
	gws := preparedGateways(t, s)
	if len(gws) != 1 {
		t.Fatalf("prepared: %v, want one", gws)
	}
	l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	l.waitStdout(t, "ready", time.Minute)
	if _, project := agentOf(t, s); project != gws[0].project {
		t.Fatalf("the run is sandbox %s, want the prepared %s", project, gws[0].project)
	}
	l.signal(t, syscall.SIGKILL)
	l.wait(t, time.Minute)
	s.WaitBackground()
	out := mustDocker(t, "ps", "-a", "--filter", "label=dev.propio-sandbox.project="+gws[0].project, "--format", "{{.Names}}")
	nets := mustDocker(t, "network", "ls", "--filter", "label=dev.propio-sandbox.project="+gws[0].project, "--format", "{{.Name}}")
	if strings.TrimSpace(out+nets) != "" {
		t.Errorf("left of the killed run: %s %s", out, nets)
	}
}

// TestPreparedOff: PROPIO_SANDBOX_PREPARE=0 prepares nothing ahead; a value
// that is not one is refused, saying what it takes, before anything is
// made.
func TestPreparedOff(t *testing.T) {
	s := newSandbox(t)
	if testenv.EnginePodman(t) {
		t.Skip("no gateway is prepared ahead on Podman: its internal networks do not keep the host out, and a fenced sandbox's namespace is made with its run")
	}
	s.uniqueWorkspace()
	s.Prepared()
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")
	s.Env = append(s.Env, "PROPIO_SANDBOX_PREPARE=0")
	if r := s.Run("", "run", "-p", p, "--", "exit", "0"); r.Code != 0 {
		t.Fatalf("run:\n%s", r)
	}
	s.WaitBackground()
	if gws := preparedGateways(t, s); len(gws) != 0 {
		t.Errorf("prepared with PROPIO_SANDBOX_PREPARE=0: %v", gws)
	}
	s.Env = append(s.Env, "PROPIO_SANDBOX_PREPARE=soon")
	r := s.Run("", "run", "-p", p, "--", "exit", "0")
	if r.Code != 1 || !strings.Contains(r.Stderr, `PROPIO_SANDBOX_PREPARE="soon"`) || !strings.Contains(r.Stderr, "off") {
		t.Errorf("a bad PROPIO_SANDBOX_PREPARE:\n%s", r)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("left: %v", left)
	}
}

// gateway is a gateway container.
type gateway struct{ id, name, project string }

// preparedGateways are the workspace's gateways prepared ahead.
func preparedGateways(t *testing.T, s *sandbox) []gateway {
	t.Helper()
	out := mustDocker(t, "ps", "-a", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace, "--filter", "label=dev.propio-sandbox.prepared=true",
		"--format", `{{.ID}} {{.Names}} {{.Label "dev.propio-sandbox.project"}}`)
	var gws []gateway
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			gws = append(gws, gateway{f[0], f[1], f[2]})
		}
	}
	return gws
}

// gatewaysOf are the names of the project's gateway containers.
func gatewaysOf(t *testing.T, project string) []string {
	t.Helper()
	out := mustDocker(t, "ps", "-a", "--filter", "label=dev.propio-sandbox.project="+project, "--filter", "label=com.docker.compose.service=gateway", "--format", "{{.Names}}")
	return strings.Fields(out)
}

// networkMembers are the names of the containers on a network, sorted.
func networkMembers(t *testing.T, network string) []string {
	t.Helper()
	out := mustDocker(t, "network", "inspect", "-f", "{{range .Containers}}{{.Name}} {{end}}", network)
	return sortedOf(strings.Fields(out)...)
}

func sortedOf(s ...string) []string {
	slices.Sort(s)
	return s
}

// mustDocker runs the docker CLI, failing the test when it fails.
func mustDocker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := docker(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
