package sandbox

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
)

// The agent's socket is bounded: connections past the cap wait unaccepted,
// a connection that sends no header is closed at the header timeout, and
// the read timeout never cuts a request that waits for a decision.

const memoryAsk = `{"kind":"resources","resources":{"memory":1073741824},"reason":"a big build"}`

// slowConn opens a connection to the agent's socket and sends half a
// header, as a flood does.
func (f *agentFixture) slowConn(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", filepath.Join(f.agentDir, ask.AgentSocketName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "POST /v1/requests HTTP/1.1\r\nHost: sandbox\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// tryPost posts body to the agent's socket, giving up at ctx's end.
func (f *agentFixture) tryPost(ctx context.Context, body string) (*http.Response, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return new(net.Dialer).DialContext(ctx, "unix", filepath.Join(f.agentDir, ask.AgentSocketName))
	}}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://sandbox/v1/requests", strings.NewReader(body))
	return c.Do(req)
}

func TestAgentSocketCapsConnections(t *testing.T) {
	f := newLimitedAgentFixture(t, agentLimits{conns: 3, header: time.Hour, read: time.Hour, idle: time.Hour}, "resources")
	slow := []net.Conn{f.slowConn(t), f.slowConn(t), f.slowConn(t)}
	// A fourth connection is not accepted while three are held: its
	// request is not answered.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if resp, err := f.tryPost(ctx, memoryAsk); !errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			resp.Body.Close()
		}
		t.Fatalf("a request past the cap: %v, want it held unaccepted", err)
	}
	// One of them ends: the next is served.
	slow[0].Close()
	if a := f.post(t, memoryAsk); a.Decision != ask.Deny || a.DecidedBy != ask.ByNoApprover {
		t.Fatalf("answer %+v, want deny by no-approver", a)
	}
}

func TestAgentSocketHeaderTimeout(t *testing.T) {
	f := newLimitedAgentFixture(t, agentLimits{conns: 2, header: 100 * time.Millisecond, read: time.Second, idle: time.Second}, "resources")
	var slow []net.Conn
	for range 5 { // more than the cap: each is served in its turn, and closed
		slow = append(slow, f.slowConn(t))
	}
	for i, c := range slow {
		c.SetReadDeadline(time.Now().Add(time.Minute))
		// The server may answer 408 before it closes; either way, the
		// connection ends.
		_, err := io.Copy(io.Discard, bufio.NewReader(c))
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("slow connection %d was never closed", i)
		}
	}
	if a := f.post(t, memoryAsk); a.Decision != ask.Deny || a.DecidedBy != ask.ByNoApprover {
		t.Fatalf("after the flood: answer %+v, want deny by no-approver", a)
	}
}

func TestAgentSocketReadTimeoutSparesAWaitingRequest(t *testing.T) {
	f := newLimitedAgentFixture(t, agentLimits{conns: 2, header: 50 * time.Millisecond, read: 50 * time.Millisecond, idle: 50 * time.Millisecond}, "resources")
	f.approve(t, func(ask.Request) ask.Decision {
		time.Sleep(300 * time.Millisecond) // the decision comes after the read timeout
		return ask.Decision{Action: ask.Deny, Scope: ask.ScopeOnce}
	})
	if a := f.post(t, memoryAsk); a.Decision != ask.Deny || a.DecidedBy != ask.ByUser {
		t.Fatalf("answer %+v, want deny by the user", a)
	}
}
