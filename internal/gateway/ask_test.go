package gateway

import (
	"bufio"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/decisionlog"
)

// askingGateway is an explicit gateway that asks, with an approver attached.
func askingGateway(t *testing.T) (*explicitGateway, <-chan ask.Event, *ask.Broker) {
	t.Helper()
	b := &ask.Broker{Project: "p", Workspace: "/w", Timeout: 5 * time.Second}
	g := newExplicitGateway(t, []string{"allowed.test"}, []string{"secret.corp.test"}, func(c *Config) { c.Ask = b })
	events, detach := b.Attach()
	t.Cleanup(detach)
	return g, events, b
}

// connectAsync sends CONNECT target and returns the response when it comes.
func connectAsync(t *testing.T, proxy, target string) <-chan *http.Response {
	t.Helper()
	out := make(chan *http.Response, 1)
	conn, err := net.DialTimeout("tcp", proxy, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := conn.Write([]byte("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
		if err != nil {
			resp = &http.Response{StatusCode: 0, Status: err.Error()}
		}
		out <- resp
	}()
	return out
}

func lastEntry(t *testing.T, g *explicitGateway) decisionlog.Entry {
	t.Helper()
	es := g.log.entries(t)
	if len(es) == 0 {
		t.Fatal("nothing logged")
	}
	return es[len(es)-1]
}

func TestAskHeldConnect(t *testing.T) {
	g, events, b := askingGateway(t)
	port, _ := startGreeter(t, "tcp4")
	target := hostPort("other.test", port)

	// Held until the user allows it once; the same CONNECT then proceeds.
	resp := connectAsync(t, g.http, target)
	ev := <-events
	if ev.Type != ask.EventPending || ev.Request.Host != "other.test" || ev.Request.Port != int(port) || ev.Request.Via != "connect" {
		t.Fatalf("event = %+v", ev)
	}
	if err := b.Decide(ev.Request.ID, ask.Decision{Action: ask.Allow, Scope: ask.ScopeOnce}); err != nil {
		t.Fatal(err)
	}
	if r := <-resp; r.StatusCode != http.StatusOK {
		t.Fatalf("after allow once: %s", r.Status)
	}
	<-events // decided

	// Once is once: the next one asks again; denied for the run, it is
	// refused, and so is the one after, without asking.
	resp = connectAsync(t, g.http, target)
	ev = <-events
	if err := b.Decide(ev.Request.ID, ask.Decision{Action: ask.Deny, Scope: ask.ScopeRun}); err != nil {
		t.Fatal(err)
	}
	if r := <-resp; r.StatusCode != http.StatusForbidden {
		t.Fatalf("after deny run: %s", r.Status)
	}
	<-events
	if r := <-connectAsync(t, g.http, target); r.StatusCode != http.StatusForbidden {
		t.Fatalf("denied for the run, asked again: %s", r.Status)
	}
	if e := lastEntry(t, g); e.DecidedBy != ask.ByUser || e.Scope != ask.ScopeRun || e.Allowed {
		t.Fatalf("last entry = %+v; want denied by the user for the run", e)
	}

	// A deny rule, a raw address and what no rule can allow never ask.
	for _, target := range []string{"secret.corp.test:443", "192.0.2.1:443", "169.254.169.254:80", "other.test:2375"} {
		if r := <-connectAsync(t, g.http, target); r.StatusCode != http.StatusForbidden {
			t.Fatalf("%s: %s; want 403 at once", target, r.Status)
		}
		if e := lastEntry(t, g); e.DecidedBy != ask.ByRule {
			t.Fatalf("%s: decided by %q, want rule", target, e.DecidedBy)
		}
	}
	select {
	case ev := <-events:
		t.Fatalf("asked %+v", ev)
	default:
	}
}

func TestAskNoApprover(t *testing.T) {
	b := &ask.Broker{Project: "p", Workspace: "/w", Timeout: time.Minute}
	g := newExplicitGateway(t, []string{"allowed.test"}, nil, func(c *Config) { c.Ask = b })
	start := time.Now()
	if r := <-connectAsync(t, g.http, "other.test:443"); r.StatusCode != http.StatusForbidden {
		t.Fatalf("no approver: %s", r.Status)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("no approver took %v", d)
	}
	if e := lastEntry(t, g); e.DecidedBy != ask.ByNoApprover || e.Allowed {
		t.Fatalf("entry = %+v", e)
	}
}

func TestAskDNS(t *testing.T) {
	b := &ask.Broker{Project: "p", Workspace: "/w", Timeout: 5 * time.Second}
	p := newExplicitGateway(t, []string{"allowed.test"}, nil, func(c *Config) { c.Ask = b })
	events, detach := b.Attach()
	defer detach()
	d := &DNS{Config: p.cfg, Answer: netip.MustParseAddr("192.0.2.53")}
	answer := make(chan []byte, 1)
	go func() {
		answer <- d.respond(nil, dnsQuery(t, 7, "other.test.", dnsmessage.TypeA, dnsmessage.ClassINET))
	}()
	ev := <-events
	if ev.Request.Via != "dns" || ev.Request.Port != 0 || ev.Request.Host != "other.test" {
		t.Fatalf("event = %+v", ev)
	}
	if err := b.Decide(ev.Request.ID, ask.Decision{Action: ask.Allow, Scope: ask.ScopeOnce}); err != nil {
		t.Fatal(err)
	}
	var parser dnsmessage.Parser
	h, err := parser.Start(<-answer)
	if err != nil || h.RCode != dnsmessage.RCodeSuccess {
		t.Fatalf("answer: %v, %v", h.RCode, err)
	}
	// The connection that follows the lookup passes without asking.
	if e := p.cfg.decide(nil, "sni", "other.test", 443); !e.Allowed || e.DecidedBy != ask.ByUser {
		t.Fatalf("after the lookup: %+v", e)
	}
	// Denied for the run: NXDOMAIN, without asking again.
	go func() { answer <- d.respond(nil, dnsQuery(t, 8, "nope.test.", dnsmessage.TypeA, dnsmessage.ClassINET)) }()
	<-events // other.test decided (sent before Decide returned)
	if ev = <-events; ev.Type != ask.EventPending || ev.Request.Host != "nope.test" {
		t.Fatalf("event = %+v", ev)
	}
	b.Decide(ev.Request.ID, ask.Decision{Action: ask.Deny, Scope: ask.ScopeRun})
	if h, _ := parser.Start(<-answer); h.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("denied: %v", h.RCode)
	}
	if h, _ := parser.Start(d.respond(nil, dnsQuery(t, 9, "nope.test.", dnsmessage.TypeA, dnsmessage.ClassINET))); h.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("denied for the run: %v", h.RCode)
	}
}
