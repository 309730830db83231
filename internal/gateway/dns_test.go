package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

var (
	gatewayAddr  = netip.MustParseAddr("10.99.0.2") // only ever written into answers
	gatewayAddr6 = netip.MustParseAddr("fd99::2")
)

// dnsGateway is a DNS responder on loopback UDP and TCP whose config records
// every upstream lookup and dial (there must be none).
type dnsGateway struct {
	udp, tcp string
	log      *entryLog

	mu      sync.Mutex
	lookups []string
}

func (g *dnsGateway) calls() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.lookups...)
}

func startDNS(t *testing.T, answer6 netip.Addr) *dnsGateway {
	t.Helper()
	p, err := egress.ParsePolicy(
		[]string{"allowed.test", "*.wild.test", "ssh.test:22", "192.0.2.7"},
		[]string{"bad.wild.test"},
	)
	if err != nil {
		t.Fatal(err)
	}
	g := &dnsGateway{log: &entryLog{}}
	c := &Config{
		Policy: p,
		Log:    decisionlog.NewWriter(g.log),
		Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.lookups = append(g.lookups, "resolve "+host)
			return nil, errors.New("the DNS responder must not resolve anything")
		},
		Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.lookups = append(g.lookups, "dial "+addr)
			return nil, errors.New("the DNS responder must not dial anything")
		},
	}
	d := &DNS{Config: c, Answer: gatewayAddr, Answer6: answer6}

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	udpDone := make(chan error, 1)
	go func() { udpDone <- d.ServeUDP(pc) }()
	t.Cleanup(func() {
		pc.Close()
		select {
		case err := <-udpDone:
			if err != nil {
				t.Errorf("ServeUDP returned %v after its socket closed, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("ServeUDP did not return within 5s of its socket closing")
		}
	})
	g.udp = pc.LocalAddr().String()
	g.tcp = startServing(t, d.ServeTCP)
	return g
}

// dnsQuery packs one question with the recursion-desired bit, as a stub
// resolver sends it.
func dnsQuery(t *testing.T, id uint16, name string, typ dnsmessage.Type, class dnsmessage.Class) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: class}); err != nil {
		t.Fatal(err)
	}
	msg, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// dnsExchange sends msg over network ("udp" or "tcp") and returns the raw
// response, or nil when none came within wait.
func dnsExchange(t *testing.T, network, addr string, msg []byte, wait time.Duration) []byte {
	t.Helper()
	conn, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(wait))
	if network == "tcp" {
		msg = append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)
	}
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	if network == "udp" {
		buf := make([]byte, 65535)
		n, err := conn.Read(buf)
		if err != nil {
			return nil
		}
		return buf[:n]
	}
	var size [2]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return nil
	}
	resp := make([]byte, binary.BigEndian.Uint16(size[:]))
	if _, err := io.ReadFull(conn, resp); err != nil {
		t.Fatalf("reading a DNS response over TCP: %v", err)
	}
	return resp
}

// parseResponse checks that resp answers the query with id, repeating its
// question (questions: 1) or not (0), and returns its rcode and answers.
func parseResponse(t *testing.T, resp []byte, id uint16, questions int) (dnsmessage.RCode, []dnsmessage.Resource) {
	t.Helper()
	if resp == nil {
		t.Fatal("no response")
	}
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		t.Fatalf("unpacking the response: %v", err)
	}
	if !m.Header.Response || m.Header.ID != id || len(m.Questions) != questions {
		t.Fatalf("response header %+v with %d questions, want a response to query %d with %d", m.Header, len(m.Questions), id, questions)
	}
	return m.Header.RCode, m.Answers
}

func TestDNS(t *testing.T) {
	t.Parallel()
	g := startDNS(t, gatewayAddr6)
	tests := map[string]struct {
		name   string
		typ    dnsmessage.Type
		class  dnsmessage.Class // default IN
		rcode  dnsmessage.RCode
		answer netip.Addr // none: an empty answer section
		reason string     // a part of the log entry's reason
	}{
		"allowed A":               {name: "allowed.test.", typ: dnsmessage.TypeA, answer: gatewayAddr, reason: `allowed by network.allow "allowed.test"`},
		"allowed AAAA":            {name: "allowed.test.", typ: dnsmessage.TypeAAAA, answer: gatewayAddr6, reason: "allowed by"},
		"allowed, mixed case":     {name: "ALLOWED.Test.", typ: dnsmessage.TypeA, answer: gatewayAddr, reason: "allowed by"},
		"wildcard subdomain":      {name: "a.wild.test.", typ: dnsmessage.TypeA, answer: gatewayAddr, reason: `"*.wild.test"`},
		"deeper subdomain":        {name: "x.y.wild.test.", typ: dnsmessage.TypeA, answer: gatewayAddr, reason: `"*.wild.test"`},
		"wildcard's bare domain":  {name: "wild.test.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeNameError, reason: "no network.allow rule matches"},
		"denied by a deny rule":   {name: "bad.wild.test.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeNameError, reason: `denied by network.deny "bad.wild.test"`},
		"denied":                  {name: "denied.test.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeNameError, reason: "no network.allow rule matches"},
		"denied AAAA":             {name: "denied2.test.", typ: dnsmessage.TypeAAAA, rcode: dnsmessage.RCodeNameError, reason: "no network.allow rule matches"},
		"subdomain of an allowed": {name: "x.allowed.test.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeNameError, reason: "no network.allow rule matches"},
		"host:port rule":          {name: "ssh.test.", typ: dnsmessage.TypeA, answer: gatewayAddr, reason: `"ssh.test:22"`},
		"address as a name":       {name: "192.0.2.7.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeNameError, reason: "an address is not a name"},
		// An allowed name has no records of other types: an empty answer,
		// so a client asking for them (HTTPS, MX) moves on at once.
		"TXT of an allowed name": {name: "txt.wild.test.", typ: dnsmessage.TypeTXT, reason: `"*.wild.test"`},
		"MX":                     {name: "mx.wild.test.", typ: dnsmessage.TypeMX, reason: `"*.wild.test"`},
		"ANY":                    {name: "any.wild.test.", typ: dnsmessage.TypeALL, reason: `"*.wild.test"`},
		"HTTPS":                  {name: "https.wild.test.", typ: dnsmessage.Type(65), reason: `"*.wild.test"`},
		"TXT of a denied name":   {name: "txt.allowed.test.", typ: dnsmessage.TypeTXT, rcode: dnsmessage.RCodeNameError, reason: "no network.allow rule matches"},
		"tunnel through TXT":     {name: "aGVsbG8gd29ybGQ.t1.denied.test.", typ: dnsmessage.TypeTXT, rcode: dnsmessage.RCodeNameError, reason: "no network.allow rule matches"},
		"tunnel through A":       {name: "aGVsbG8gd29ybGQ.t2.denied.test.", typ: dnsmessage.TypeA, rcode: dnsmessage.RCodeNameError, reason: "no network.allow rule matches"},
		"class CHAOS":            {name: "version.wild.test.", typ: dnsmessage.TypeA, class: dnsmessage.ClassCHAOS, rcode: dnsmessage.RCodeRefused, reason: "only class IN"},
	}
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			t.Parallel()
			var next uint16
			for name, tt := range tests {
				next++
				id := next
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					class := tt.class
					if class == 0 {
						class = dnsmessage.ClassINET
					}
					resp := dnsExchange(t, network, g.tcpOrUDP(network), dnsQuery(t, id, tt.name, tt.typ, class), 5*time.Second)
					rcode, answers := parseResponse(t, resp, id, 1)
					if rcode != tt.rcode {
						t.Errorf("rcode %v, want %v", rcode, tt.rcode)
					}
					switch {
					case !tt.answer.IsValid() && len(answers) != 0:
						t.Errorf("answers %+v, want none", answers)
					case tt.answer.IsValid() && len(answers) != 1:
						t.Errorf("answers %+v, want %s", answers, tt.answer)
					case tt.answer.IsValid():
						a := answers[0]
						var got netip.Addr
						switch r := a.Body.(type) {
						case *dnsmessage.AResource:
							got = netip.AddrFrom4(r.A)
						case *dnsmessage.AAAAResource:
							got = netip.AddrFrom16(r.AAAA)
						}
						if got != tt.answer || a.Header.TTL != 5 || a.Header.Name.String() != tt.name || a.Header.Type != tt.typ {
							t.Errorf("answer %v, want %s %v %s with TTL 5", a, tt.name, tt.typ, tt.answer)
						}
					}
					e := g.log.waitFor(t, "dns", strings.TrimSuffix(tt.name, "."))
					if e.Allowed != (tt.rcode == dnsmessage.RCodeSuccess) || e.Port != 0 || !strings.Contains(e.Reason, tt.reason) || e.Client == "" {
						t.Errorf("log entry %+v, want allowed=%v, port 0, a client and a reason with %q", e, tt.rcode == dnsmessage.RCodeSuccess, tt.reason)
					}
				})
			}
		})
	}
	t.Cleanup(func() {
		// Runs after the subtests: nothing was looked up or dialled upstream,
		// for a denied name or any other.
		if calls := g.calls(); len(calls) != 0 {
			t.Errorf("the DNS responder went upstream: %q", calls)
		}
	})
}

func (g *dnsGateway) tcpOrUDP(network string) string {
	if network == "tcp" {
		return g.tcp
	}
	return g.udp
}

func TestDNSMalformed(t *testing.T) {
	t.Parallel()
	g := startDNS(t, netip.Addr{})
	valid := dnsQuery(t, 7, "allowed.test.", dnsmessage.TypeA, dnsmessage.ClassINET)
	response := append([]byte(nil), valid...)
	response[2] |= 0x80 // the QR bit: a response, which must not be answered (no reflection loops)
	twoQuestions := func() []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9})
		_ = b.StartQuestions()
		for _, n := range []string{"allowed.test.", "denied.test."} {
			_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(n), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		}
		msg, _ := b.Finish()
		return msg
	}()
	status := append([]byte(nil), valid...)
	status[2] |= 2 << 3 // opcode 2, STATUS

	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			t.Parallel()
			addr := g.tcpOrUDP(network)
			for name, junk := range map[string][]byte{
				"three bytes":               {1, 2, 3},
				"header only, one question": {0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
				"label past the end":        {0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 63, 'a'},
				"compression loop":          {0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1},
				"a response":                response,
				"empty":                     {},
			} {
				if resp := dnsExchange(t, network, addr, junk, 300*time.Millisecond); resp != nil {
					t.Errorf("%s: got a response %x, want the packet dropped", name, resp)
				}
			}
			if rcode, _ := parseResponse(t, dnsExchange(t, network, addr, twoQuestions, 5*time.Second), 9, 0); rcode != dnsmessage.RCodeFormatError {
				t.Errorf("two questions: rcode %v, want FORMERR", rcode)
			}
			if rcode, _ := parseResponse(t, dnsExchange(t, network, addr, status, 5*time.Second), 7, 1); rcode != dnsmessage.RCodeNotImplemented {
				t.Errorf("opcode STATUS: rcode %v, want NOTIMP", rcode)
			}
			// The server still answers.
			resp := dnsExchange(t, network, addr, valid, 5*time.Second)
			if rcode, answers := parseResponse(t, resp, 7, 1); rcode != dnsmessage.RCodeSuccess || len(answers) != 1 {
				t.Errorf("rcode %v, answers %v after malformed queries, want the gateway's address", rcode, answers)
			}
		})
	}
}

func TestDNSNoAnswer6(t *testing.T) {
	t.Parallel()
	g := startDNS(t, netip.Addr{})
	for _, tt := range []struct {
		name  string
		rcode dnsmessage.RCode
	}{
		{"allowed.test.", dnsmessage.RCodeSuccess}, // NOERROR, no records: the client falls back to A
		{"denied.test.", dnsmessage.RCodeNameError},
	} {
		rcode, answers := parseResponse(t, dnsExchange(t, "udp", g.udp, dnsQuery(t, 3, tt.name, dnsmessage.TypeAAAA, dnsmessage.ClassINET), 5*time.Second), 3, 1)
		if rcode != tt.rcode || len(answers) != 0 {
			t.Errorf("AAAA %s: rcode %v, answers %v; want %v and no answers", tt.name, rcode, answers, tt.rcode)
		}
	}
}

func TestNameDecision(t *testing.T) {
	t.Parallel()
	p, err := egress.ParsePolicy(
		[]string{"allowed.test", "*.wild.test", "ssh.test:22", "git.test:2222", "192.0.2.7", "*.part.test"},
		[]string{"bad.wild.test", "https-only.part.test:80", "blocked.part.test"},
	)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		allowed bool
		rule    string
	}{
		"allowed.test":            {true, "allowed.test"},
		"Allowed.Test.":           {true, "allowed.test"},
		"x.allowed.test":          {false, ""},
		"a.wild.test":             {true, "*.wild.test"},
		"wild.test":               {false, ""},
		"bad.wild.test":           {false, "bad.wild.test"},
		"ssh.test":                {true, "ssh.test:22"},
		"git.test":                {true, "git.test:2222"},
		"https-only.part.test":    {true, "*.part.test"}, // still allowed on 443
		"blocked.part.test":       {false, "blocked.part.test"},
		"192.0.2.7":               {false, ""},
		"not a name.test":         {false, ""},
		"denied.test":             {false, ""},
		"ssh.test.evil.test":      {false, ""},
		"a.ssh.test":              {false, ""},
		"xn--bcher-kva.wild.test": {true, "*.wild.test"},
	}
	for name, tt := range tests {
		d := nameDecision(p, name)
		if d.Allowed != tt.allowed || d.Rule != tt.rule || d.Reason == "" {
			t.Errorf("nameDecision(%q) = %+v, want allowed=%v by %q with a reason", name, d, tt.allowed, tt.rule)
		}
	}
}

// TestDNSRepeatOutOfOrder: a client's A and AAAA queries for one name are
// answered at once, and the second to log may have read the clock a few
// nanoseconds before the first: it is still one line. A decision logged
// again after dnsTTL, either way, is a new one.
func TestDNSRepeatOutOfOrder(t *testing.T) {
	d := &DNS{}
	dec := dnsDecision{name: "denied.test", reason: "no network.allow rule matches"}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if d.repeat(dec, at) {
		t.Fatal("the first decision is a repeat")
	}
	if !d.repeat(dec, at.Add(-10*time.Nanosecond)) {
		t.Error("a decision logged 10 ns later than its twin is not a repeat")
	}
	if !d.repeat(dec, at.Add(time.Second)) {
		t.Error("a decision a second later is not a repeat")
	}
	if d.repeat(dec, at.Add(-dnsTTL*time.Second)) {
		t.Error("a decision dnsTTL earlier (the clock went back) is a repeat")
	}
}
