package e2e

import (
	"errors"
	"fmt"
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
	if engineRootless(t) {
		podmanRootlessFenced(t, s, strings.TrimSpace(agent), bridge, ln)
	}
	l.signal(t, syscall.SIGTERM)
	l.wait(t, time.Minute)
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// podmanRootlessFenced is TestPodmanAllowlistFenced's part on a rootless
// Podman (keep-id), whose networks live in a network namespace of the
// user's that reaches out through slirp4netns: the agent, in the user
// namespace of its namespace's holder, is the user, and what it writes in
// the workspace is the user's; the host is out of its reach at each of its
// own addresses (slirp4netns takes a packet to any of them to the host's
// services), at slirp4netns's way to its loopback (10.0.2.2) and resolver
// (10.0.2.3), and at host.containers.internal: the host's listener ln gets
// no datagram; and Podman's resolver on the bridge, which answers a
// container of the sandbox network that is not fenced in (the test runs
// one), does not answer the agent: the fence drops its query as it is
// sent ("operation not permitted").
func podmanRootlessFenced(t *testing.T, s *sandbox, agent string, bridge netip.Addr, ln net.PacketConn) {
	t.Helper()
	out, err := docker("exec", agent, "/probe", "id")
	if want := fmt.Sprintf("uid=%d gid=%d ", os.Getuid(), os.Getgid()); err != nil || !strings.Contains(out, want) {
		t.Errorf("the agent's id on a rootless Podman: %v\n%s\nwant %s", err, out, want)
	}
	if out, err := docker("exec", agent, "/probe", "write", "/workspace/rootless.txt", "mine"); err != nil {
		t.Errorf("writing in the workspace: %v\n%s", err, out)
	} else if fi, err := os.Stat(filepath.Join(s.Workspace, "rootless.txt")); err != nil {
		t.Error(err)
	} else if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() || int(st.Gid) != os.Getgid() {
		t.Errorf("a file the agent wrote is owned by %d:%d on the host, want the user's %d:%d", st.Uid, st.Gid, os.Getuid(), os.Getgid())
	}
	hosts, err := docker("exec", agent, "/probe", "read", "/etc/hosts")
	if err != nil {
		t.Fatalf("the agent's /etc/hosts: %v", err)
	}
	port := strconv.Itoa(ln.LocalAddr().(*net.UDPAddr).Port)
	targets := []string{"10.0.2.2:" + port, "10.0.2.3:53", "host.containers.internal:" + port}
	for _, a := range hostAddrs(t) {
		targets = append(targets, a+":"+port)
	}
	if !strings.Contains(hosts, "host.containers.internal") {
		t.Errorf("no host.containers.internal in the agent's /etc/hosts, which Podman writes:\n%s", hosts)
	}
	// None of them is on the sandbox network, which is internal: the agent
	// has no route to them (and no capability to add one), so the kernel
	// refuses the datagram before the fence sees it ("network is
	// unreachable"); the fence would drop it next.
	for _, target := range targets {
		out, _ := docker("exec", agent, "/probe", "udp", "--timeout=2s", target, "rootless-fence")
		if !strings.Contains(out, "operation not permitted") && !strings.Contains(out, "network is unreachable") {
			t.Errorf("a datagram to %s left the sandbox:\n%s", target, out)
		}
	}
	ln.SetReadDeadline(time.Now().Add(time.Second))
	if n, from, err := ln.ReadFrom(make([]byte, 512)); err == nil {
		t.Errorf("the host's listener got a datagram of %d bytes from %s", n, from)
	}
	// Podman's resolver answers a container of the sandbox network that is
	// not fenced in, by the holder's name: the fence is what keeps the agent
	// from it.
	holder, err := docker("ps", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace, "--filter", "label=com.docker.compose.service=netns", "--format", "{{.Names}}")
	if err != nil || strings.TrimSpace(holder) == "" {
		t.Fatalf("the namespace's holder: %v %q", err, holder)
	}
	name := strings.TrimSpace(holder)
	unfenced, err := docker("run", "--rm", "--network", sandboxNetwork(t, s), ProbeImage, "dns", "--timeout=3s", bridge.String()+":53", name)
	if len(answers(unfenced)) == 0 {
		t.Errorf("the control: Podman's resolver at %s did not answer %s for a container of the sandbox network without the fence (%v):\n%s", bridge, name, err, unfenced)
	}
	out, _ = docker("exec", agent, "/probe", "dns", "--timeout=3s", bridge.String()+":53", name)
	if !strings.Contains(out, "operation not permitted") || len(answers(out)) > 0 {
		t.Errorf("the agent's query to Podman's resolver at %s was not stopped by its fence:\n%s", bridge, out)
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
