package e2e

// The sandbox's environment, its way to the host, and its exit code,
// observed from inside real sandboxes.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestEnvPassthrough: only the variables the profile passes reach the
// sandbox, by name or glob; env.set gives defaults that a passed host value
// overrides; a variable the host has but the profile does not pass is unset.
func TestEnvPassthrough(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := s.Profile(probeOffline + `env:
  pass: [E2E_TOKEN, "E2E_GLOB_*", E2E_OVERRIDE, E2E_DEFAULT]
  set: {E2E_OVERRIDE: from-profile, E2E_DEFAULT: from-profile, E2E_SET_ONLY: from-profile}
`)
	token := "token-" + randomID()
	s.Env = append(s.Env,
		"E2E_TOKEN="+token,
		"E2E_GLOB_A=glob a",
		"E2E_GLOB_B=glob=b",
		"E2E_OVERRIDE=from-host",
		"E2E_SET_ONLY=from-host", // not passed: the profile's value stays
		"E2E_NOT_PASSED=on the host only",
		"E2E_GLOBX=near miss",
	)
	r := probeRun(s, p, "env", "E2E_TOKEN", "E2E_GLOB_A", "E2E_GLOB_B", "E2E_OVERRIDE", "E2E_DEFAULT", "E2E_SET_ONLY", "E2E_NOT_PASSED", "E2E_GLOBX")
	want := strings.Join([]string{
		"E2E_TOKEN=" + token,
		"E2E_GLOB_A=glob a",
		"E2E_GLOB_B=glob=b",
		"E2E_OVERRIDE=from-host",
		"E2E_DEFAULT=from-profile",
		"E2E_SET_ONLY=from-profile",
		"E2E_NOT_PASSED unset",
		"E2E_GLOBX unset",
	}, "\n") + "\n"
	if r.Code != 0 || r.Stdout != want {
		t.Fatalf("want stdout\n%s\ngot:\n%s", want, r)
	}
}

// TestEnvSecretNotEchoed: a passed value goes to the sandbox and nowhere
// else: the launcher itself never prints it, whether the run succeeds or fails.
func TestEnvSecretNotEchoed(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	secret := "e2e-secret-" + randomID()
	s.Env = append(s.Env, "E2E_TOKEN="+secret)
	p := s.Profile(probeOffline + "env: {pass: [E2E_TOKEN]}\n")
	// The control: the value does reach the sandbox.
	probeOK(t, probeRun(s, p, "env", "E2E_TOKEN"), "E2E_TOKEN="+secret)
	for _, args := range [][]string{{"id"}, {"exit", "7"}, {"read", "/nonexistent"}} {
		r := probeRun(s, p, args...)
		if strings.Contains(r.Stdout, secret) || strings.Contains(r.Stderr, secret) {
			t.Fatalf("the secret appears in the launcher's output of %v:\n%s", args, r)
		}
	}
	// A run refused before starting (a required variable missing) does not
	// print it either.
	bad := s.Profile(probeOffline + "env: {pass: [E2E_TOKEN, E2E_MISSING], required: [E2E_TOKEN, E2E_MISSING]}\n")
	r := probeRun(s, bad, "id")
	if r.Code != 3 || strings.Contains(r.Stdout+r.Stderr, secret) {
		t.Fatalf("want exit 3 (a failed preflight check) without the secret in the output:\n%s", r)
	}
}

// TestEnvRequired: a required variable the host lacks stops the run before
// any container exists, naming the variable; with it set, the run starts.
func TestEnvRequired(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := s.Profile(probeOffline + "env: {pass: [E2E_REQUIRED_VAR], required: [E2E_REQUIRED_VAR]}\n")
	r := probeRun(s, p, "id")
	if r.Code != 3 || !strings.Contains(r.Stderr, "preflight check env.required failed") || !strings.Contains(r.Stderr, "E2E_REQUIRED_VAR") {
		t.Fatalf("want exit 3 from the env.required check naming E2E_REQUIRED_VAR:\n%s", r)
	}
	if strings.Contains(r.Stdout, "uid=") {
		t.Fatalf("the probe ran:\n%s", r)
	}
	out, err := docker("ps", "-a", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace, "--format", "{{.Names}}")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "" {
		t.Fatalf("containers exist after a refused run: %s", out)
	}
	s.Env = append(s.Env, "E2E_REQUIRED_VAR=present")
	probeOK(t, probeRun(s, p, "env", "E2E_REQUIRED_VAR"), "E2E_REQUIRED_VAR=present")
}

// envGreeter listens on the engine's bridge gateway, the host's address as the
// sandbox sees it, and greets every connection. It returns the port and a
// count of the connections it accepted.
func envGreeter(t *testing.T, greeting string) (gateway string, port int, accepted *atomic.Int64) {
	t.Helper()
	gateway, err := bridgeGateway()
	if err != nil {
		t.Fatalf("finding the address host-gateway means: %v", err)
	}
	// IP_FREEBIND: Podman puts the address on its bridge only while a
	// container is on it, which the sandbox is not yet.
	lc := net.ListenConfig{Control: freeBind}
	ln, err := lc.Listen(t.Context(), "tcp", net.JoinHostPort(gateway, "0"))
	if err != nil {
		t.Fatalf("listening on the bridge gateway: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write([]byte(greeting))
			c.Close()
		}
	}()
	return gateway, ln.Addr().(*net.TCPAddr).Port, accepted
}

// bridgeGateway is the address host.docker.internal (host-gateway) leads to,
// found as dockerd finds it: the default bridge network's gateway, which is
// the address of the bridge's interface (docker0). `docker network inspect
// bridge` shows it in IPAM.Config only when the engine was told it or found
// it on the interface at start; a daemon that made docker0 itself lists the
// subnet alone, and then the interface the network names
// (com.docker.network.bridge.name) has it. Podman lists the gateway of its
// default network.
func bridgeGateway() (string, error) {
	out, err := docker("network", "inspect", "bridge", "--format", "{{json .}}")
	if err != nil {
		return "", fmt.Errorf("docker network inspect bridge: %v: %s", err, out)
	}
	var n struct {
		IPAM struct {
			Config []struct{ Subnet, Gateway string }
		}
		Options map[string]string
	}
	if err := json.Unmarshal([]byte(out), &n); err != nil {
		return "", fmt.Errorf("decoding docker network inspect bridge: %v", err)
	}
	return gatewayOf(n.IPAM.Config, n.Options["com.docker.network.bridge.name"], interfaceAddrs)
}

// gatewayOf is the IPv4 gateway of a bridge network with the IPAM
// configs given: the first gateway listed, else the IPv4 address of the
// bridge's interface (docker0 when unnamed) that lies in a listed subnet,
// as addrs reports them.
func gatewayOf(configs []struct{ Subnet, Gateway string }, iface string, addrs func(string) ([]netip.Prefix, error)) (string, error) {
	var subnets []netip.Prefix
	for _, c := range configs {
		if gw, err := netip.ParseAddr(c.Gateway); err == nil && gw.Is4() {
			return gw.String(), nil
		}
		if p, err := netip.ParsePrefix(c.Subnet); err == nil && p.Addr().Is4() {
			subnets = append(subnets, p.Masked())
		}
	}
	if iface == "" {
		iface = "docker0"
	}
	have, err := addrs(iface)
	if err != nil {
		return "", fmt.Errorf("the bridge network lists no gateway (subnets %v), and its interface %s: %v", subnets, iface, err)
	}
	for _, a := range have {
		for _, s := range subnets {
			if a.Addr().Is4() && s.Contains(a.Addr()) {
				return a.Addr().String(), nil
			}
		}
	}
	return "", fmt.Errorf("the bridge network lists no gateway, and no address of its interface %s (%v) is in its subnets %v", iface, have, subnets)
}

// interfaceAddrs are the addresses of the host's interface name.
func interfaceAddrs(name string) ([]netip.Prefix, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, err
	}
	list, err := ifi.Addrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range list {
		if ipn, ok := a.(*net.IPNet); ok {
			if addr, ok := netip.AddrFromSlice(ipn.IP); ok {
				ones, _ := ipn.Mask.Size()
				out = append(out, netip.PrefixFrom(addr.Unmap(), ones))
			}
		}
	}
	return out, nil
}

// TestBridgeGatewayOf: the gateway listed wins; a bridge listing only its
// subnet (a daemon that made docker0 itself) has it on its interface.
func TestBridgeGatewayOf(t *testing.T) {
	t.Parallel()
	docker0 := func(name string) ([]netip.Prefix, error) {
		if name != "docker0" {
			return nil, fmt.Errorf("no such interface %s", name)
		}
		return []netip.Prefix{netip.MustParsePrefix("fe80::1/64"), netip.MustParsePrefix("172.17.0.1/16")}, nil
	}
	type cfg = struct{ Subnet, Gateway string }
	for _, c := range []struct {
		name    string
		configs []cfg
		iface   string
		want    string
	}{
		{"listed", []cfg{{"172.18.0.0/16", "172.18.0.1"}}, "", "172.18.0.1"},
		{"subnet only, docker0", []cfg{{"172.17.0.0/16", ""}}, "", "172.17.0.1"},
		{"subnet only, named", []cfg{{"172.17.0.0/16", ""}}, "docker0", "172.17.0.1"},
		{"ipv6 listed first", []cfg{{"fd00::/64", "fd00::1"}, {"172.17.0.0/16", ""}}, "", "172.17.0.1"},
		{"address outside the subnet", []cfg{{"10.9.0.0/16", ""}}, "", ""},
		{"no interface", []cfg{{"172.17.0.0/16", ""}}, "br0", ""},
	} {
		got, err := gatewayOf(c.configs, c.iface, docker0)
		if got != c.want || (err != nil) != (c.want == "") {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}

// TestEnvHostGateway: with an open network, host.docker.internal (Podman:
// host.containers.internal, its own name) reaches a server on the host (the
// test's own); with none, neither the name nor the address does.
func TestEnvHostGateway(t *testing.T) {
	t.Parallel()
	requireEngine(t)
	hostName := "host.docker.internal"
	if testenv.EnginePodman(t) {
		hostName = "host.containers.internal"
	}
	t.Run("open", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		greeting := "hello from the host " + randomID()
		_, port, accepted := envGreeter(t, greeting)
		p := s.Profile("network: {mode: open}\n")
		probeOK(t, probeRun(s, p, "connect", net.JoinHostPort(hostName, strconv.Itoa(port))), "connected: "+greeting)
		if n := accepted.Load(); n != 1 {
			t.Fatalf("the host's server accepted %d connections, want 1", n)
		}
	})
	t.Run("none", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		gateway, port, accepted := envGreeter(t, "unreachable")
		p := s.Profile(probeOffline)
		for _, addr := range []string{hostName, gateway} {
			r := probeRun(s, p, "connect", net.JoinHostPort(addr, strconv.Itoa(port)))
			if r.Code != 1 || !strings.Contains(r.Stdout, "error: ") || strings.Contains(r.Stdout, "connected") {
				t.Fatalf("want connect to %s to fail without a network:\n%s", addr, r)
			}
		}
		if n := accepted.Load(); n != 0 {
			t.Fatalf("the host's server accepted %d connections from a sandbox without network", n)
		}
	})
}

// TestEnvExitCodes: the sandbox's exit status is the launcher's, and the
// launcher adds no error of its own.
func TestEnvExitCodes(t *testing.T) {
	t.Parallel()
	for _, code := range []int{0, 3, 255} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			s := newSandbox(t)
			p := s.Profile(probeOffline)
			r := probeRun(s, p, "exit", strconv.Itoa(code))
			if r.Code != code || strings.Contains(r.Stderr, "error") {
				t.Fatalf("want exit %d and no error:\n%s", code, r)
			}
		})
	}
}
