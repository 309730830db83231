package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/moby/moby/client"
)

// reachBudget bounds the ping that tells whether the engine is still there.
const reachBudget = 2 * time.Second

// errNoFreshPing: the host is reached through a transport (ssh, a named
// pipe) on which the engine cannot be pinged apart from the client's own
// connections.
var errNoFreshPing = errors.New("no fresh ping over this transport")

// freshPing asks the engine at host for /_ping on a connection of its own,
// never one the client keeps open: an engine that is shutting down has
// closed its listener but still serves the connections it had. It returns
// the answer's headers.
func freshPing(ctx context.Context, host string) (http.Header, error) {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	base := ""
	switch {
	case strings.HasPrefix(host, "unix://"):
		sock := strings.TrimPrefix(host, "unix://")
		hc.Transport = &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
		base = "http://d"
	case strings.HasPrefix(host, "tcp://"), strings.HasPrefix(host, "http://"):
		base = "http://" + strings.TrimPrefix(strings.TrimPrefix(host, "tcp://"), "http://")
	default:
		return nil, errNoFreshPing
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, base+"/_ping", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		return nil, fmt.Errorf("the engine answers %s", resp.Status)
	}
	return resp.Header, nil
}

// kindOf tells Podman from Docker by the headers of an answer, when they
// say: Podman adds its own API's version to each.
func kindOf(h http.Header) (kind string, known bool) {
	if h.Get("Libpod-Api-Version") != "" {
		return Podman, true
	}
	if strings.HasPrefix(h.Get("Server"), "Docker/") {
		return Docker, true
	}
	return "", false
}

// Reachable says whether the engine still answers, on a connection of its
// own, within a short time: an error when it is gone (stopped, or shutting
// down), or does not answer.
func (e *Engine) Reachable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, reachBudget)
	defer cancel()
	_, err := freshPing(ctx, e.Host)
	if errors.Is(err, errNoFreshPing) {
		_, err = e.cli.Client().Ping(ctx, client.PingOptions{})
	}
	if err != nil {
		return fmt.Errorf("the engine at %s does not answer: %w", e.Host, err)
	}
	return nil
}
