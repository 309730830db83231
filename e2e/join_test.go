package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestAllowlistJoin: a profile extending strict names, in network.join, a
// network the test makes, with a server container on it (a stand-in for a
// local model server, Ollama's port 11434); its gateway joins it, so the
// allow rule NAME:11434 reaches the server by its container name, through
// the proxy and the transparent path. Another port of the server is denied,
// and the sandbox itself is not on that network: it has no route to the
// server's address. No outside network is named (no
// PROPIO_SANDBOX_GATEWAY_NETWORK): the field alone does it.
func TestAllowlistJoin(t *testing.T) {
	s := newSandbox(t)
	id := randomID()
	network, server := "propio-e2e-models-"+id, "propio-e2e-model-"+id
	if _, err := docker("network", "create", "--label", "dev.propio-sandbox.e2e=1", network); err != nil {
		t.Fatalf("creating the test network: %v", err)
	}
	t.Cleanup(func() {
		docker("rm", "-f", server)
		testenv.RemoveNetwork(t, network)
	})
	// Port offset 11354: HTTP on 11434, the echo servers on 11376 and 11361.
	if _, err := docker("run", "-d", "--label", "dev.propio-sandbox.e2e=1", "--network", network, "--name", server,
		"-e", "PROBE_PORT_OFFSET=11354", ProbeImage, "serve", "model"); err != nil {
		t.Fatalf("starting the server: %v", err)
	}
	logs := func() string { out, _ := docker("logs", server); return out }
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(logs(), "serving model"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server never started:\n%s", logs())
		}
	}
	addr, err := docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", server)
	if err != nil {
		t.Fatal(err)
	}
	addr = strings.TrimSpace(addr)

	p := s.Profile(fmt.Sprintf("extends: strict\nimage: %s\nnetwork:\n  join: [%s]\n  allow: [\"%s:11434\"]\n", ProbeImage, network, server))
	for _, way := range []string{"proxy", "transparent"} {
		args := []string{"run", "-p", p, "--", "fetch", "--fail"}
		if way == "transparent" {
			args = append(args, "--no-proxy")
		}
		r := s.Run("", append(args, "http://"+server+":11434/api/tags")...)
		if want := "model http " + server + ":11434 /api/tags"; r.Code != 0 || !strings.Contains(r.Stdout, want) {
			t.Errorf("%s: want %q:\n%s", way, want, r)
		}
	}
	for _, way := range []string{"proxy", "transparent"} {
		args := []string{"run", "-p", p, "--", "fetch", "--fail", "--timeout", "3s"}
		if way == "transparent" {
			args = append(args, "--no-proxy")
		}
		if r := s.Run("", append(args, "http://"+server+":11376/")...); r.Code == 0 {
			t.Errorf("%s: a port no rule allows was reached:\n%s", way, r)
		}
		denied := false
		for _, e := range decisions(t, s, true) {
			denied = denied || e["host"] == server && e["allowed"] == false
		}
		if !denied {
			t.Errorf("%s: logs --denied has no denial for %s", way, server)
		}
	}
	if r := s.Run("", "run", "-p", p, "--", "fetch", "--no-proxy", "--timeout", "3s", "http://"+addr+":11434/direct"); r.Code == 0 || strings.Contains(logs(), "/direct") {
		t.Errorf("the sandbox reached the server's address %s directly: it is on the joined network:\n%s", addr, r)
	}
	// A network the engine does not have stops run before anything starts.
	gone := s.Profile(fmt.Sprintf("extends: strict\nimage: %s\nnetwork:\n  join: [%s-gone]\n", ProbeImage, network))
	r := s.Run("", "run", "-p", gone, "--", "true")
	if want := gone + ":4:10: network.join[0]: the engine has no network " + network + "-gone"; r.Code != 3 || !strings.Contains(r.Stderr, "preflight check network.join failed: "+want) ||
		!strings.Contains(r.Stderr, "hint: create it and start the server the sandbox needs on it (docker network create "+network+"-gone;") {
		t.Errorf("a missing network: want exit 3 and %q with a hint:\n%s", want, r)
	}
	if l := logs(); strings.Contains(l, "conn 22 ") || strings.Contains(l, "conn 7 ") {
		t.Errorf("the server saw a connection on a port no rule allows:\n%s", l)
	}
}
