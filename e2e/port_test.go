package e2e

// The port request: a server inside a sandbox with no network, with an
// allowlist, or open, is reached from the host through the port the launcher
// publishes on 127.0.0.1 once asked; when the sandbox ends, the port is
// closed and nothing of it remains.
//
// The request is made through the tests' hook of the launcher (its build
// with the tag e2ehooks serves the request handlers on a host socket), not
// the agent's channel, and asks no one.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestPort(t *testing.T) {
	for _, tc := range []struct{ name, network string }{
		{"none", "network: {mode: none}\n"},
		{"allowlist", "network:\n  mode: allowlist\n  allow: [allowed.test]\n"},
		{"open", "network: {mode: open}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t)
			// probe serve answers HTTP on 80+8000, as the user.
			p := s.Profile(tc.network + "env: {set: {PROBE_PORT_OFFSET: \"8000\"}}\n")
			sock := portHookSocket(t, s)
			l := cleanupStart(t, s, "run", "-p", p, "--", "serve", "inside")
			l.waitStdout(t, "serving inside", time.Minute)

			res, errText := portRequest(t, sock, `{"kind":"port","port":8080,"reason":"preview the app"}`)
			if errText != "" {
				t.Fatalf("port 8080: %s\n%s", errText, l.result())
			}
			url, _ := res["url"].(string)
			hostPort, _ := res["host_port"].(float64)
			if !strings.HasPrefix(url, "http://127.0.0.1:") || url != fmt.Sprintf("http://127.0.0.1:%d", int(hostPort)) {
				t.Fatalf("result %v: want http://127.0.0.1:HOST_PORT and host_port", res)
			}
			body, err := portGet(url + "/preview")
			if err != nil || !strings.Contains(body, "inside http") || !strings.Contains(body, "/preview") {
				t.Fatalf("GET %s/preview from the host: %q, %v", url, body, err)
			}
			// Refused: the same port again, and a port that is not one.
			if _, e := portRequest(t, sock, `{"kind":"port","port":8080}`); !strings.Contains(e, "published already") {
				t.Errorf("port 8080 again: error %q, want published already", e)
			}
			if _, e := portRequest(t, sock, `{"kind":"port","port":70000}`); !strings.Contains(e, "not a port") {
				t.Errorf("port 70000: error %q, want not a port", e)
			}
			// The relay runs with no network of its own, no capability, read-only.
			portCheckRelay(t, s)

			l.signal(t, syscall.SIGTERM)
			r := l.wait(t, time.Minute)
			if r.Code != 143 {
				t.Errorf("want exit 143 after SIGTERM:\n%s", r)
			}
			if left := s.Leftovers(); len(left) > 0 {
				t.Errorf("the launcher exited while these remained: %v", left)
			}
			if c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 5*time.Second); err == nil {
				c.Close()
				t.Errorf("%s still accepts connections after the sandbox ended", url)
			}
		})
	}
}

// portHookSocket sets the launcher's tests' hook socket, in a short
// directory of its own (a socket's path is short), and returns its path.
func portHookSocket(t *testing.T, s *sandbox) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "port")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "req.sock")
	s.Env = append(s.Env, "PROPIO_SANDBOX_E2E_REQUESTS="+sock)
	return sock
}

// portRequest posts a request to the launcher's hook and returns its result,
// or its error's text.
func portRequest(t *testing.T, sock, body string) (map[string]any, string) {
	t.Helper()
	c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := c.Post("http://launcher/v1/requests", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("posting %s to the launcher's hook: %v", body, err)
	}
	defer resp.Body.Close()
	var answer struct {
		Result map[string]any `json:"result"`
		Error  string         `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatalf("the launcher's answer to %s: %v", body, err)
	}
	return answer.Result, answer.Error
}

func portGet(url string) (string, error) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// portCheckRelay checks the relay container of the workspace's sandbox as
// the engine holds it.
func portCheckRelay(t *testing.T, s *sandbox) {
	t.Helper()
	ids, err := docker("ps", "-q", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace, "--filter", "ancestor="+portGatewayImage(t, s))
	if err != nil || len(strings.Fields(ids)) == 0 {
		t.Errorf("no relay container found: %q, %v", ids, err)
		return
	}
	for _, id := range strings.Fields(ids) {
		out, err := docker("inspect", "--format", "{{.HostConfig.NetworkMode}} {{.HostConfig.CapDrop}} {{.HostConfig.ReadonlyRootfs}} {{.Config.User}} {{json .Config.Cmd}}", id)
		if err != nil {
			t.Errorf("inspecting %s: %v", id, err)
			continue
		}
		if !strings.Contains(out, "port-relay") {
			continue // the allowlist's gateway
		}
		if !strings.HasPrefix(out, "container:") || !strings.Contains(out, "[ALL] true") || !strings.Contains(out, fmt.Sprintf(" %d:%d ", os.Getuid(), os.Getgid())) {
			t.Errorf("relay %s: %s; want network container:AGENT, cap_drop ALL, read-only, the user's uid", id, out)
		}
		return
	}
	t.Errorf("no port-relay container among %v", strings.Fields(ids))
}

// portGatewayImage is the gateway image the launcher made of itself.
func portGatewayImage(t *testing.T, s *sandbox) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.Home, ".local", "state", "propio-sandbox", "gateway-image"))
	if err != nil {
		t.Fatalf("reading the gateway image's tag: %v", err)
	}
	_, tag, _ := strings.Cut(string(b), "\n")
	return tag
}
