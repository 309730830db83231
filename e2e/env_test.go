package e2e

// The sandbox's environment, its way to the host, and its exit code,
// observed from inside real sandboxes.

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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
	out, err := docker("network", "inspect", "bridge", "--format", "{{(index .IPAM.Config 0).Gateway}}")
	if err != nil {
		t.Fatalf("finding the bridge gateway: %v", err)
	}
	gateway = strings.TrimSpace(out)
	if net.ParseIP(gateway) == nil {
		t.Fatalf("the bridge gateway %q is not an IP address", gateway)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(gateway, "0"))
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

// TestEnvHostGateway: with an open network, host.docker.internal reaches a
// server on the host (the test's own); with none, neither the name nor the
// address does.
func TestEnvHostGateway(t *testing.T) {
	t.Parallel()
	t.Run("open", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		greeting := "hello from the host " + randomID()
		_, port, accepted := envGreeter(t, greeting)
		p := s.Profile("network: {mode: open}\n")
		probeOK(t, probeRun(s, p, "connect", "host.docker.internal:"+strconv.Itoa(port)), "connected: "+greeting)
		if n := accepted.Load(); n != 1 {
			t.Fatalf("the host's server accepted %d connections, want 1", n)
		}
	})
	t.Run("none", func(t *testing.T) {
		t.Parallel()
		s := newSandbox(t)
		gateway, port, accepted := envGreeter(t, "unreachable")
		p := s.Profile(probeOffline)
		for _, addr := range []string{"host.docker.internal", gateway} {
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
