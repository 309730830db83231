package gateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

// dnsTTL is the TTL of every answer, in seconds: short, so a policy change
// or a restarted gateway is seen quickly.
const dnsTTL = 5

// dnsIdleTimeout closes a DNS-over-TCP connection that sends nothing.
const dnsIdleTimeout = 10 * time.Second

// dnsConcurrency bounds the UDP queries answered at once.
const dnsConcurrency = 64

// dnsLookupTimeout bounds the upstream lookup behind an answer: less than
// a client waits for one. A name not resolved by then is answered with the
// gateway's own address, whose listeners resolve it again.
const dnsLookupTimeout = 3 * time.Second

// DNS is the sandbox's resolver. It answers A (and AAAA) queries for names
// the policy allows on some port with the gateway's own address, so the
// connection comes to the gateway's TLS, HTTP or TCP listeners, which decide
// it again with its port; or, when the gateway's kernel forwards (Config.
// Kernel), an A query with the name's virtual address (see kernel.go), for
// which the gateway resolves the allowed name upstream. A query of another
// type for an allowed name gets an empty answer (NOERROR, no records). A
// denied name does not exist: every query for it is answered NXDOMAIN, which
// glibc's and musl's resolvers both take as final (musl retries a REFUSED
// until it times out). A query for a denied name, and whatever a DNS tunnel
// hides in it, reaches nobody.
//
// Each decision is logged once: the A and AAAA queries a client sends
// together, and the same query repeated, within dnsTTL, are one line.
type DNS struct {
	Config *Config
	// Answer is the gateway's IPv4 address on the sandbox network.
	Answer netip.Addr
	// Answer6 is its IPv6 address; when it is not set, AAAA queries for
	// allowed names get an empty answer.
	Answer6 netip.Addr

	mu     sync.Mutex
	logged map[dnsDecision]time.Time // when each decision was last logged
}

// dnsDecision is what a DNS log line says, for telling a repeat.
type dnsDecision struct {
	name, rule, reason, err string
	allowed                 bool
	by                      decidedBy
}

// ServeUDP answers the queries that arrive on pc until pc is closed, then
// returns nil. Malformed packets are dropped.
func (d *DNS) ServeUDP(pc net.PacketConn) error {
	if d.Config == nil || d.Config.Log == nil {
		return errors.New("gateway: DNS.Config and its Log are required")
	}
	buf := make([]byte, 65535)
	// Answering may wait for an upstream lookup (kernel forwarding): a few
	// queries at once, so one slow name does not hold up the others.
	busy := make(chan struct{}, dnsConcurrency)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("dns: reading a query: %w", err)
		}
		query := bytes.Clone(buf[:n])
		busy <- struct{}{}
		go func() {
			defer func() { <-busy }()
			if resp := d.safeRespond(from, query); resp != nil {
				_, _ = pc.WriteTo(resp, from) // a client that went away is not the server's problem
			}
		}()
	}
}

// ServeTCP answers DNS over TCP on l until l is closed, then returns nil. A
// connection that sends a malformed query is closed.
func (d *DNS) ServeTCP(l net.Listener) error {
	if d.Config == nil {
		return errors.New("gateway: DNS.Config is required")
	}
	return d.Config.acceptEach(l, "dns", func(_ context.Context, conn net.Conn) { d.serveTCPConn(conn) })
}

func (d *DNS) serveTCPConn(conn net.Conn) {
	defer conn.Close()
	var size [2]byte
	buf := make([]byte, 65535)
	for {
		if err := conn.SetDeadline(time.Now().Add(dnsIdleTimeout)); err != nil {
			return
		}
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return
		}
		query := buf[:binary.BigEndian.Uint16(size[:])]
		if _, err := io.ReadFull(conn, query); err != nil {
			return
		}
		resp := d.safeRespond(conn.RemoteAddr(), query)
		if resp == nil {
			return
		}
		out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp)))
		if _, err := conn.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// safeRespond is respond, with a panic logged and the packet dropped.
func (d *DNS) safeRespond(client net.Addr, query []byte) (resp []byte) {
	defer func() {
		if v := recover(); v != nil {
			resp = nil
			d.log(client, "", false, "", "internal error", fmt.Sprintf("panic: %v", v))
		}
	}()
	return d.respond(client, query)
}

// respond builds the response to one query, or returns nil to drop it.
func (d *DNS) respond(client net.Addr, query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil
	}
	if len(qs) != 1 { // no response repeats them: it could outgrow the query
		return dnsReply(h, nil, dnsmessage.RCodeFormatError, netip.Addr{})
	}
	q := &qs[0]
	if h.OpCode != 0 {
		return dnsReply(h, q, dnsmessage.RCodeNotImplemented, netip.Addr{})
	}
	name := strings.TrimSuffix(q.Name.String(), ".")
	if q.Class != dnsmessage.ClassINET {
		d.log(client, name, false, "", "only class IN queries are answered, not "+strings.TrimPrefix(q.Class.String(), "Class"), "")
		return dnsReply(h, q, dnsmessage.RCodeRefused, netip.Addr{})
	}
	dec := nameDecision(d.Config.Policy, name)
	by := d.Config.lookupAsk(name, &dec)
	if !dec.Allowed {
		d.logBy(client, name, dec.Allowed, dec.Rule, dec.Reason, "", by)
		return dnsReply(h, q, dnsmessage.RCodeNameError, netip.Addr{})
	}
	var answer netip.Addr
	switch q.Type {
	case dnsmessage.TypeA:
		answer = d.Answer
		v, ok, err := d.Config.virtualAnswer(context.Background(), name)
		var refused *refusedError
		var lookup *lookupError
		switch {
		case errors.As(err, &refused):
			// Allowed, but it resolves to what no rule can allow: nothing
			// would pass, so say it now.
			d.log(client, name, false, "", err.Error(), "")
			return dnsReply(h, q, dnsmessage.RCodeNameError, netip.Addr{})
		case errors.As(err, &lookup) && lookup.notFound():
			// Allowed, but there is no such name: the client learns it now.
			d.log(client, name, dec.Allowed, dec.Rule, dec.Reason, lookup.Error())
			return dnsReply(h, q, dnsmessage.RCodeNameError, netip.Addr{})
		case err != nil:
			// Not resolved now: the gateway's listeners try again, per
			// connection; the failure is logged as one.
			d.log(client, name, dec.Allowed, dec.Rule, dec.Reason, err.Error())
			return dnsReply(h, q, dnsmessage.RCodeSuccess, answer)
		case ok:
			answer = v
		}
	case dnsmessage.TypeAAAA:
		answer = d.Answer6
	}
	d.logBy(client, name, dec.Allowed, dec.Rule, dec.Reason, "", by)
	return dnsReply(h, q, dnsmessage.RCodeSuccess, answer)
}

func (d *DNS) log(client net.Addr, name string, allowed bool, rule, reason, errText string) {
	d.logBy(client, name, allowed, rule, reason, errText, decidedBy{ask.ByRule, ""})
}

// logBy logs a decision of the DNS server, decided by by.
func (d *DNS) logBy(client net.Addr, name string, allowed bool, rule, reason, errText string, by decidedBy) {
	now := d.Config.now()
	if d.repeat(dnsDecision{name: name, rule: rule, reason: reason, err: errText, allowed: allowed, by: by}, now) {
		return
	}
	e := decisionlog.Entry{Time: now.UTC(), Via: "dns", Host: name, Allowed: allowed, Rule: rule, Reason: reason, Error: errText, DecidedBy: by.who, Scope: by.scope}
	if client != nil {
		e.Client = client.String()
	}
	_ = d.Config.Log.Write(e)
}

// repeat reports whether dec was logged less than dnsTTL before or after
// now, and otherwise notes that it is logged now. After: a client's A and
// AAAA queries, answered at once, read the clock before taking the lock,
// so the second one here may be a few nanoseconds earlier.
func (d *DNS) repeat(dec dnsDecision, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if last, ok := d.logged[dec]; ok && now.Sub(last) > -dnsTTL*time.Second && now.Sub(last) < dnsTTL*time.Second {
		return true
	}
	if d.logged == nil || len(d.logged) >= 4096 {
		d.logged = map[dnsDecision]time.Time{}
	}
	d.logged[dec] = now
	return false
}

// dnsReply builds a response to h that repeats the question q (if any) and,
// when answer is valid and of q's type, answers it with one A or AAAA
// record. It returns nil if the response cannot be built.
func dnsReply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, answer netip.Addr) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), dnsmessage.Header{
		ID:                 h.ID,
		Response:           true,
		OpCode:             h.OpCode,
		RecursionDesired:   h.RecursionDesired,
		RecursionAvailable: true,
		RCode:              rcode,
	})
	b.EnableCompression()
	if q != nil {
		if err := b.StartQuestions(); err != nil {
			return nil
		}
		if err := b.Question(*q); err != nil {
			return nil
		}
	}
	if q != nil && answer.IsValid() {
		if err := b.StartAnswers(); err != nil {
			return nil
		}
		rh := dnsmessage.ResourceHeader{Name: q.Name, Type: q.Type, Class: dnsmessage.ClassINET, TTL: dnsTTL}
		var err error
		switch {
		case q.Type == dnsmessage.TypeA && answer.Is4():
			err = b.AResource(rh, dnsmessage.AResource{A: answer.As4()})
		case q.Type == dnsmessage.TypeAAAA && answer.Is6() && !answer.Is4In6():
			err = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: answer.As16()})
		}
		if err != nil {
			return nil
		}
	}
	msg, err := b.Finish()
	if err != nil {
		return nil
	}
	return msg
}

// nameDecision says whether the policy allows name on any port: on 443 or
// 80 (the ports of a rule without one), or on the port of any allow rule
// that names one, such as github.com:22. Deny rules count as they do for a
// connection. Denied, it returns the most telling reason: a deny rule's, or
// the decision for port 443. The listeners decide again with the real port.
func nameDecision(p egress.Policy, name string) egress.Decision {
	host := strings.TrimSuffix(strings.ToLower(name), ".")
	if _, err := netip.ParseAddr(host); err == nil {
		return egress.Decision{Reason: "an address is not a name to resolve"}
	}
	var first egress.Decision
	for i, port := range namePorts(p) {
		dec := p.Decide(host, port)
		if dec.Allowed {
			return dec
		}
		if i == 0 || first.Rule == "" && dec.Rule != "" {
			first = dec
		}
	}
	return first
}

// namePorts are the ports a name may be allowed on: 443 and 80 (the ports of
// a rule without one), then the port of each allow rule that names one.
func namePorts(p egress.Policy) []uint16 {
	ports := []uint16{443, 80}
	for _, r := range p.Allow {
		if r.Host != "" && r.Port != 0 {
			ports = append(ports, r.Port)
		}
	}
	return ports
}
