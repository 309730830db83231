package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/egress"
)

// fakeKernel records what the gateway asks the kernel to forward; Original
// reports dst for every connection.
type fakeKernel struct {
	mu       sync.Mutex
	forwards map[netip.Addr]string // virtual address -> "ports -> upstream"
	calls    int
	fail     bool
	dst      netip.AddrPort
}

func (k *fakeKernel) Forward(v netip.Addr, ports []uint16, to netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	if k.fail {
		return errors.New("no kernel here")
	}
	if k.forwards == nil {
		k.forwards = map[netip.Addr]string{}
	}
	k.forwards[v] = fmt.Sprint(ports, " -> ", to)
	return nil
}

func (k *fakeKernel) Original(net.Conn) (netip.AddrPort, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.dst.IsValid() {
		return netip.AddrPort{}, errors.New("not redirected")
	}
	return k.dst, nil
}

func kernelConfig(t *testing.T, k *fakeKernel, virtual string) (*Config, *entryLog) {
	t.Helper()
	p, err := egress.ParsePolicy([]string{"allowed.test", "*.wild.test", "ssh.test:22", "rebind.test", "v6only.test"}, []string{"bad.wild.test"})
	if err != nil {
		t.Fatal(err)
	}
	log := &entryLog{}
	c := &Config{
		Policy: p, Log: decisionlog.NewWriter(log), Kernel: k, Virtual: netip.MustParsePrefix(virtual),
		Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			switch host {
			case "rebind.test":
				return []netip.Addr{netip.MustParseAddr("192.0.2.9"), netip.MustParseAddr("169.254.169.254")}, nil
			case "v6only.test":
				return []netip.Addr{netip.MustParseAddr("2001:db8::1")}, nil
			case "gone.wild.test":
				return nil, errors.New("server misbehaving")
			case "missing.wild.test":
				return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			}
			return []netip.Addr{netip.MustParseAddr("2001:db8::2"), netip.MustParseAddr("192.0.2." + fmt.Sprint(len(host)))}, nil
		},
	}
	c.virtual = newVirtualTable(c.Virtual)
	return c, log
}

func TestVirtualAnswer(t *testing.T) {
	k := &fakeKernel{}
	c, _ := kernelConfig(t, k, "10.99.0.128/25")
	ctx := context.Background()

	a, ok, err := c.virtualAnswer(ctx, "allowed.test")
	if err != nil || !ok || a != netip.MustParseAddr("10.99.0.129") {
		t.Fatalf("allowed.test: %v %v %v, want the first virtual address", a, ok, err)
	}
	if got := k.forwards[a]; got != "[80 443] -> 192.0.2.12" {
		t.Errorf("allowed.test forwards %q, want its ports to its IPv4 upstream", got)
	}
	// Asked again: the same address, and nothing new for the kernel.
	if again, _, _ := c.virtualAnswer(ctx, "allowed.test"); again != a || k.calls != 1 {
		t.Errorf("asked again: %v after %d kernel calls, want %v after 1", again, k.calls, a)
	}
	ssh, ok, _ := c.virtualAnswer(ctx, "ssh.test")
	if !ok || ssh == a || k.forwards[ssh] != "[22] -> 192.0.2.8" {
		t.Errorf("ssh.test: %v forwards %q, want its own address forwarding only port 22", ssh, k.forwards[ssh])
	}
	if _, ok, err := c.virtualAnswer(ctx, "rebind.test"); ok || err == nil {
		t.Errorf("a name resolving to the metadata address got a virtual address (err %v)", err)
	}
	if v, ok, err := c.virtualAnswer(ctx, "v6only.test"); ok || err != nil {
		t.Errorf("v6only.test: %v %v %v, want the user-space path (no virtual address, no error)", v, ok, err)
	}
	var lookup *lookupError
	if v, ok, err := c.virtualAnswer(ctx, "gone.wild.test"); ok || !errors.As(err, &lookup) || lookup.notFound() {
		t.Errorf("gone.wild.test: %v %v %v, want a lookup error that is not a missing name", v, ok, err)
	}
	// A virtual address is never an upstream.
	if why := c.refuses(a); why == "" {
		t.Errorf("the virtual address %v may be an upstream", a)
	}
}

func TestVirtualAnswerReusesTheLeastRecent(t *testing.T) {
	k := &fakeKernel{}
	c, _ := kernelConfig(t, k, "10.99.0.128/30") // two usable addresses
	now := time.Unix(1000, 0)
	c.Now = func() time.Time { now = now.Add(time.Second); return now }
	ctx := context.Background()
	a1, _, _ := c.virtualAnswer(ctx, "a.wild.test")
	a2, _, _ := c.virtualAnswer(ctx, "bb.wild.test")
	c.virtualAnswer(ctx, "a.wild.test") // a is now the more recent
	a3, ok, _ := c.virtualAnswer(ctx, "ccc.wild.test")
	if !ok || a3 != a2 || a1 == a2 {
		t.Fatalf("addresses %v %v, then %v for a third name: want bb's (the least recent) reused", a1, a2, a3)
	}
	if name, _ := c.virtual.name(a3); name != "ccc.wild.test" {
		t.Errorf("the reused address stands for %q", name)
	}
	if got := k.forwards[a3]; got != "[80 443] -> 192.0.2.13" {
		t.Errorf("the reused address forwards %q", got)
	}
}

func TestVirtualAnswerKernelFails(t *testing.T) {
	k := &fakeKernel{fail: true}
	c, _ := kernelConfig(t, k, "10.99.0.128/25")
	if a, ok, err := c.virtualAnswer(context.Background(), "allowed.test"); ok || err != nil {
		t.Fatalf("with a failing kernel: %v %v %v, want the user-space path", a, ok, err)
	}
	if _, ok := c.virtual.byName["allowed.test"]; ok {
		t.Error("a mapping the kernel refused is kept")
	}
}

func TestCatchAndForwardedLog(t *testing.T) {
	k := &fakeKernel{}
	c, log := kernelConfig(t, k, "10.99.0.128/25")
	a, _, _ := c.virtualAnswer(context.Background(), "ssh.test")
	k.dst = netip.AddrPortFrom(a, 7)

	addr := startServing(t, c.ServeCatch)
	// The catch listener resets the connection at once, which may reach
	// the client while Dial still reports on it: then the dial fails so.
	conn, err := net.Dial("tcp", addr)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	e := log.waitFor(t, "nat", "ssh.test")
	checkEntry(t, e, "nat", "ssh.test", 7, false, "", "no network.allow rule matches")
	if conn != nil {
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			t.Error("the caught connection was not closed")
		}
	}

	c.LogForwarded(Conn{
		Start: time.Unix(5, 0), Client: netip.MustParseAddrPort("10.99.0.3:40000"),
		Dst: netip.AddrPortFrom(a, 22), Upstream: netip.MustParseAddrPort("192.0.2.8:22"), BytesUp: 10, BytesDown: 20,
	})
	var got []decisionlog.Entry
	for _, e := range log.entries(t) {
		if e.Via == "nat" && e.Allowed {
			got = append(got, e)
		}
	}
	if len(got) != 1 || got[0].Host != "ssh.test" || got[0].Port != 22 || got[0].BytesUp != 10 || got[0].BytesDown != 20 ||
		got[0].Client != "10.99.0.3:40000" || !got[0].Time.Equal(time.Unix(5, 0)) || got[0].Rule != "ssh.test:22" {
		t.Errorf("forwarded connection logged as %+v", got)
	}
}

// TestLogRefused: a connection the kernel refused (a port its name is not
// allowed on) is logged as denied, with the name and port it was going to.
func TestLogRefused(t *testing.T) {
	c, log := kernelConfig(t, &fakeKernel{}, "10.99.0.128/25")
	a, _, _ := c.virtualAnswer(context.Background(), "ssh.test")
	c.LogRefused(Conn{Start: time.Unix(7, 0), Client: netip.MustParseAddrPort("127.0.0.1:40001"), Dst: netip.AddrPortFrom(a, 80)})
	c.LogRefused(Conn{Start: time.Unix(8, 0), Client: netip.MustParseAddrPort("10.99.0.3:40002"), Dst: netip.AddrPortFrom(a, 22)})
	got := log.entries(t)
	if len(got) != 2 {
		t.Fatalf("logged %+v, want two entries", got)
	}
	checkEntry(t, got[0], "nat", "ssh.test", 80, false, "", "no network.allow rule matches")
	// Port 22 is allowed: refused only because its ports changed as it
	// connected; denied all the same.
	if e := got[1]; e.Allowed || e.Port != 22 || !strings.Contains(e.Reason, "was not forwarded") || !e.Time.Equal(time.Unix(8, 0)) {
		t.Errorf("a refused connection to an allowed port logged as %+v", e)
	}
}

func TestAllowedPorts(t *testing.T) {
	c, _ := kernelConfig(t, &fakeKernel{}, "10.99.0.128/25")
	for name, want := range map[string][]uint16{
		"allowed.test":  {80, 443},
		"ssh.test":      {22},
		"x.wild.test":   {80, 443},
		"bad.wild.test": nil,
		"denied.test":   nil,
	} {
		if got := c.allowedPorts(name); !slices.Equal(got, want) {
			t.Errorf("%s: ports %v, want %v", name, got, want)
		}
	}
}

// TestDNSVirtualAnswers: over UDP, an allowed name gets its virtual address,
// a name whose upstream lookup hangs does not hold up the others, and is
// answered with the gateway's own address once the lookup gives up.
func TestDNSVirtualAnswers(t *testing.T) {
	k := &fakeKernel{}
	c, _ := kernelConfig(t, k, "10.99.0.128/25")
	release := make(chan struct{})
	defer close(release)
	resolve := c.Resolve
	c.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
		if host == "slow.wild.test" {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-release:
			}
		}
		return resolve(ctx, host)
	}
	c.virtual = newVirtualTable(c.Virtual)
	d := &DNS{Config: c, Answer: gatewayAddr}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go d.ServeUDP(pc)
	addr := pc.LocalAddr().String()

	slow := make(chan []byte, 1)
	go func() {
		slow <- dnsExchange(t, "udp", addr, dnsQuery(t, 1, "slow.wild.test.", dnsmessage.TypeA, dnsmessage.ClassINET), 10*time.Second)
	}()
	time.Sleep(100 * time.Millisecond) // the slow query is first
	start := time.Now()
	_, answers := parseResponse(t, dnsExchange(t, "udp", addr, dnsQuery(t, 2, "allowed.test.", dnsmessage.TypeA, dnsmessage.ClassINET), 2*time.Second), 2, 1)
	if len(answers) != 1 || netip.AddrFrom4(answers[0].Body.(*dnsmessage.AResource).A) != netip.MustParseAddr("10.99.0.129") {
		t.Fatalf("allowed.test answered with %v, want its virtual address", answers)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("allowed.test waited %v behind a slow lookup", took)
	}
	_, answers = parseResponse(t, <-slow, 1, 1)
	if len(answers) != 1 || netip.AddrFrom4(answers[0].Body.(*dnsmessage.AResource).A) != gatewayAddr {
		t.Errorf("the name whose lookup gave up answered with %v, want the gateway's own address", answers)
	}
}

// TestDNSResolutionFailures: with kernel forwarding, an allowed name that does
// not exist upstream is answered NXDOMAIN at once, and one whose lookup fails
// for now gets the gateway's own address (its listeners try again); both
// are logged as failures (allowed, with the error), not as plain allowed.
func TestDNSResolutionFailures(t *testing.T) {
	c, log := kernelConfig(t, &fakeKernel{}, "10.99.0.128/25")
	d := &DNS{Config: c, Answer: gatewayAddr}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go d.ServeUDP(pc)
	addr := pc.LocalAddr().String()
	for i, tt := range []struct {
		name   string
		rcode  dnsmessage.RCode
		answer netip.Addr
		errs   string
	}{
		{"missing.wild.test", dnsmessage.RCodeNameError, netip.Addr{}, "no such host"},
		{"gone.wild.test", dnsmessage.RCodeSuccess, gatewayAddr, "server misbehaving"},
	} {
		id := uint16(10 + i)
		rcode, answers := parseResponse(t, dnsExchange(t, "udp", addr, dnsQuery(t, id, tt.name+".", dnsmessage.TypeA, dnsmessage.ClassINET), 5*time.Second), id, 1)
		var got netip.Addr
		if len(answers) == 1 {
			got = netip.AddrFrom4(answers[0].Body.(*dnsmessage.AResource).A)
		}
		if rcode != tt.rcode || got != tt.answer || len(answers) > 1 {
			t.Errorf("%s: rcode %v, answers %v; want %v and %v", tt.name, rcode, answers, tt.rcode, tt.answer)
		}
		e := log.waitFor(t, "dns", tt.name)
		if !e.Allowed || !strings.Contains(e.Error, tt.errs) || e.Outcome() != decisionlog.Failed {
			t.Errorf("%s logged as %+v, want a failure with %q", tt.name, e, tt.errs)
		}
	}
}

// TestDNSLogsEachDecisionOnce: the A and AAAA queries of one lookup, and
// the same query again within the answer's TTL, make one log line; another
// name, or the same one later, makes its own.
func TestDNSLogsEachDecisionOnce(t *testing.T) {
	c, log := kernelConfig(t, &fakeKernel{}, "10.99.0.128/25")
	now := time.Unix(1000, 0)
	c.Now = func() time.Time { return now }
	d := &DNS{Config: c, Answer: gatewayAddr}
	ask := func(name string, typ dnsmessage.Type) {
		t.Helper()
		if resp := d.respond(&net.UDPAddr{IP: net.IPv4(10, 99, 0, 3), Port: 5353}, dnsQuery(t, 1, name, typ, dnsmessage.ClassINET)); resp == nil {
			t.Fatalf("no answer to %s", name)
		}
	}
	for range 3 {
		ask("allowed.test.", dnsmessage.TypeA)
		ask("allowed.test.", dnsmessage.TypeAAAA)
		ask("denied.test.", dnsmessage.TypeA)
		ask("denied.test.", dnsmessage.TypeAAAA)
	}
	now = now.Add(6 * time.Second)
	ask("allowed.test.", dnsmessage.TypeA)
	var got []string
	for _, e := range log.entries(t) {
		got = append(got, fmt.Sprint(e.Host, " ", e.Allowed))
	}
	want := []string{"allowed.test true", "denied.test false", "allowed.test true"}
	if !slices.Equal(got, want) {
		t.Errorf("logged %q, want %q", got, want)
	}
}
