package bench

// How long the gateway takes to answer a request its rules decide: a DNS
// query (an allowed name gets the gateway's address, a denied one NXDOMAIN),
// a request to the HTTP proxy, a CONNECT and a TLS connection to a denied
// name (a 403, or a reset). Target: p50 under 1 ms for each. The gateway
// runs in this process on loopback, with the built-in standard profile's
// rules (the longest allow list there is), relaying in user space, writing
// its log to nowhere; each request is timed by its client, from sending
// (for TCP: from dialling) to the answer, so the time includes the client's
// own socket work. No upstream is involved: these are the requests that
// rules alone decide. Prints each arm's p50, p90 and p99 and the ratio of
// its p50 to the target; asserts nothing.

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
	"github.com/propio/propio-sandbox/internal/gateway"
	"github.com/propio/propio-sandbox/internal/profile"
)

// DecisionTarget is the highest acceptable p50 of a rule-decided request.
const DecisionTarget = time.Millisecond

// decisionRequests is how many requests each arm makes a round.
const decisionRequests = 200

func TestGatewayDecision(t *testing.T) {
	rounds := benchRounds(t, "gateway decision benchmark", "a few seconds", 10)
	cfg, addrs := startDecisionGateway(t)
	arms := []struct {
		name string
		req  func() error
	}{
		{"dns, allowed name (A)", func() error { return dnsAsk(addrs["dns-udp"], "registry.npmjs.org.", dnsmessage.RCodeSuccess) }},
		{"dns, denied name (NXDOMAIN)", func() error { return dnsAsk(addrs["dns-udp"], "denied.test.", dnsmessage.RCodeNameError) }},
		{"http proxy, denied (403)", func() error {
			return proxyAsk(addrs["http-proxy"], "GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n")
		}},
		{"connect, denied (403)", func() error {
			return proxyAsk(addrs["http-proxy"], "CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n")
		}},
		{"tls by server name, denied (reset)", func() error { return tlsAsk(addrs["tls"], "denied.test") }},
	}
	samples := make([][]time.Duration, len(arms))
	for round := range rounds + 1 { // round 0 warms up and is not counted
		for k := range arms {
			i := (k + round) % len(arms) // each round starts with another arm
			for range decisionRequests {
				start := time.Now()
				if err := arms[i].req(); err != nil {
					t.Fatalf("%s: %v", arms[i].name, err)
				}
				if round > 0 {
					samples[i] = append(samples[i], time.Since(start))
				}
			}
		}
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "rule-decided requests, %d each (%d rounds), against the %v p50 target:\n", rounds*decisionRequests, rounds, DecisionTarget)
	fmt.Fprintln(tw, "ARM\tP50\tP90\tP99\tP50/TARGET")
	for i, a := range arms {
		s := samples[i]
		slices.Sort(s)
		p50 := s[len(s)/2]
		fmt.Fprintf(tw, "%s\t%v\t%v\t%v\t%.3fx\n", a.name, round(p50), round(s[len(s)*9/10]), round(s[len(s)*99/100]), float64(p50)/float64(DecisionTarget))
	}
	tw.Flush()

	// The rules alone, for reference: one Decide of a denied name.
	start, n := time.Now(), 100000
	for range n {
		_ = cfg.Policy.Decide("denied.test", 443)
	}
	fmt.Printf("policy.Decide alone (%d allow rules): %v a decision\n", len(cfg.Policy.Allow), time.Since(start)/time.Duration(n))
}

func round(d time.Duration) time.Duration { return d.Round(time.Microsecond) }

// startDecisionGateway serves a gateway with the standard profile's rules on
// loopback, every port free, and returns its config and addresses.
func startDecisionGateway(t *testing.T) (*gateway.Config, map[string]string) {
	t.Helper()
	p, err := profile.Locations{}.Load("standard")
	if err != nil {
		t.Fatal(err)
	}
	var allow, deny []string
	for _, r := range p.Network.Allow {
		allow = append(allow, r.Text)
	}
	for _, r := range p.Network.Deny {
		deny = append(deny, r.Text)
	}
	policy, err := egress.ParsePolicy(allow, deny)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &gateway.Config{Policy: policy, Profile: "builtin:standard:1", Log: decisionlog.NewWriter(io.Discard)}
	srv, err := gateway.Listen(cfg, netip.MustParseAddr("127.0.0.1"), gateway.Ports{Bind: func(uint16) uint16 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close() })
	addrs := map[string]string{}
	for name, a := range srv.Addrs() {
		addrs[name] = a.String()
	}
	return cfg, addrs
}

// dnsAsk sends one A query for name over UDP and checks the answer's rcode.
func dnsAsk(server, name string, want dnsmessage.RCode) error {
	conn, err := net.Dial("udp", server)
	if err != nil {
		return err
	}
	defer conn.Close()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		return err
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(q); err != nil {
		return err
	}
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	if err != nil {
		return err
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		return err
	}
	if m.Header.RCode != want {
		return fmt.Errorf("%s: rcode %v, want %v", name, m.Header.RCode, want)
	}
	return nil
}

// proxyAsk sends req to the HTTP proxy on a new connection and checks that
// the answer is a 403.
func proxyAsk(proxy, req string) error {
	conn, err := net.Dial("tcp", proxy)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		return fmt.Errorf("status %s, want 403", resp.Status)
	}
	return nil
}

// tlsAsk starts a TLS handshake with server name name on a new connection
// and checks that the gateway ends it without answering.
func tlsAsk(addr, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{ServerName: name}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		conn.Close()
		return fmt.Errorf("a TLS handshake with %s succeeded", name)
	}
	if strings.Contains(err.Error(), "deadline") {
		return err
	}
	return nil
}
