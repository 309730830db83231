package e2e

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestPodmanAllowlistFenced: on rootful Podman an allowlist sandbox runs,
// in a network namespace that a container of its own holds and fences in to
// loopback and the gateway before the agent joins it (Podman gives the host
// an address on the sandbox's internal network, and serves DNS there: the
// egress tests, which .ci/run runs on Podman too, show that neither is
// reachable). The agent holds no capability to lift the fence, and nothing
// is left after the run; the holder is made once. CI runs this file's
// tests with DOCKER_HOST at Podman's socket.
func TestPodmanAllowlistFenced(t *testing.T) {
	s := newSandbox(t)
	if !testenv.EnginePodman(t) {
		t.Skip("the engine is Docker: .ci/run runs this test on Podman")
	}
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")
	since := time.Now()
	r := s.Run("", "run", "-p", p, "--", "id")
	if r.Code != 0 || !strings.Contains(r.Stdout, "cwd=/workspace") {
		t.Fatalf("an allowlist sandbox on Podman:\n%s", r)
	}
	// The namespace's holder is made once: the one whose fence the launcher
	// checked is the one the agent joins. (Podman names a container's
	// network by its name where Docker gives its ID, and the Compose SDK
	// took the holder for one on the wrong network, and made it again after
	// the check.)
	created, err := docker("events", "--since", strconv.FormatInt(since.Unix(), 10), "--until", strconv.FormatInt(time.Now().Unix()+1, 10),
		"--filter", "label=dev.propio-sandbox.workspace="+s.Workspace, "--filter", "event=create",
		"--format", `{{index .Actor.Attributes "com.docker.compose.service"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(created); strings.Join(got, " ") != "netns gateway agent" {
		t.Errorf("containers made for one run, by service: %q, want netns, gateway, agent, once each", got)
	}
	// The agent's capabilities, as the engine has them: none to add.
	l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	l.waitStdout(t, "ready", 2*time.Minute)
	label := "label=dev.propio-sandbox.workspace=" + s.Workspace
	agent, err := docker("ps", "-q", "--filter", label, "--filter", "label=com.docker.compose.service=agent")
	if err != nil || strings.TrimSpace(agent) == "" {
		t.Fatalf("no agent container: %v", err)
	}
	out, err := docker("inspect", "-f", "{{.HostConfig.NetworkMode}} {{.HostConfig.CapAdd}} {{.HostConfig.Privileged}}", strings.TrimSpace(agent))
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(out); len(f) < 3 || !strings.HasPrefix(f[0], "container:") || strings.Contains(out, "NET_ADMIN") || f[len(f)-1] != "false" {
		t.Errorf("the agent's network mode, added capabilities and privilege: %s", out)
	}
	// The attack: the host's address on the sandbox network (its bridge's),
	// where Podman's resolver listens too, and any other address there but
	// the gateway's. The fence drops a packet as it leaves the sandbox's
	// namespace, which the kernel tells the sender of a datagram at once:
	// "operation not permitted". So the test sees that it is the fence that
	// stops it, whatever the host's own firewall would do after it
	// (e2e/podman-setup.sh's rejects what reaches the host from a sandbox
	// network, and so cannot show the fence). TCP is dropped alike
	// (TestAllowlist's bypass/ subtests, which run on Podman too).
	subnet, err := docker("network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}}{{end}}", sandboxNetwork(t, s))
	if err != nil {
		t.Fatal(err)
	}
	bridge := netip.MustParsePrefix(strings.TrimSpace(subnet)).Masked().Addr().Next()
	ln, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.LocalAddr().(*net.UDPAddr).Port)
	for _, target := range []string{bridge.String() + ":" + port, bridge.String() + ":53", bridge.Next().Next().Next().String() + ":9"} {
		out, _ := docker("exec", strings.TrimSpace(agent), "/probe", "udp", "--timeout=2s", target, "fence")
		if !strings.Contains(out, "operation not permitted") {
			t.Errorf("a datagram to %s from the sandbox was not stopped by its fence:\n%s", target, out)
		}
	}
	l.signal(t, syscall.SIGTERM)
	l.wait(t, time.Minute)
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestPodmanServiceStarted: with --engine podman and no Podman API service
// listening on the socket CONTAINER_HOST names, the launcher starts `podman
// system service` there for the run and stops it afterwards.
func TestPodmanServiceStarted(t *testing.T) {
	s := newSandbox(t)
	if !testenv.EnginePodman(t) {
		t.Skip("the engine is Docker: .ci/run runs this test on Podman")
	}
	sock := filepath.Join(t.TempDir(), "podman.sock")
	s.Env = append(s.Env, "CONTAINER_HOST=unix://"+sock)
	p := s.Profile("network: {mode: none}\n")
	r := s.Run("", "--engine", "podman", "run", "-p", p, "--", "id")
	if r.Code != 0 || !strings.Contains(r.Stdout, "cwd=/workspace") {
		t.Fatalf("run through a service started for it:\n%s", r)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the service's socket is still there after the run (%v)", err)
	}
	out, _ := exec.Command("pgrep", "-f", "podman system service --time=0 unix://"+sock).Output()
	if strings.TrimSpace(string(out)) != "" {
		t.Errorf("the service started for the run still runs: pids %s", out)
	}
}
