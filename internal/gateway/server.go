package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/propio/propio-sandbox/internal/egress"
)

// The ports a gateway listens on by default: the usual ports of an HTTP
// proxy and a SOCKS5 proxy, and the ports the sandbox's tools dial for DNS,
// HTTP and TLS once the gateway's DNS has answered them with its address.
const (
	DefaultHTTPProxyPort = 3128
	DefaultSOCKSPort     = 1080
	DefaultDNSPort       = 53
	DefaultHTTPPort      = 80
	DefaultTLSPort       = 443
	// DefaultCatchPort is where the kernel redirects what it does not
	// forward to a virtual address (Config.Kernel).
	DefaultCatchPort = 1
	// DefaultRefusePort is where the kernel redirects a connection to a
	// name's virtual address on a port the policy does not allow: nothing
	// listens there, so the client is refused as by a closed port.
	DefaultRefusePort = 2
)

// Ports are where a gateway listens; a zero field means its default. Each is
// the port the sandbox dials, so the HTTP and TLS listeners connect upstream
// on their own port, and a host:port rule's TCP forward listens on the rule's
// port.
type Ports struct {
	HTTPProxy, SOCKS, DNS, HTTP, TLS, Catch uint16
	// Refuse is never bound (Config.Kernel refuses connections there); no
	// forward may take it.
	Refuse uint16
	// Bind maps each of those ports, and each forward's, to the port to bind
	// (0: any free port, as tests want); nil binds every port as it is. The
	// gateway's behaviour, the upstream ports included, follows the ports
	// above, not the bound ones.
	Bind func(port uint16) uint16
}

func (p Ports) withDefaults() Ports {
	p.HTTPProxy = cmp.Or(p.HTTPProxy, DefaultHTTPProxyPort)
	p.SOCKS = cmp.Or(p.SOCKS, DefaultSOCKSPort)
	p.DNS = cmp.Or(p.DNS, DefaultDNSPort)
	p.HTTP = cmp.Or(p.HTTP, DefaultHTTPPort)
	p.TLS = cmp.Or(p.TLS, DefaultTLSPort)
	p.Catch = cmp.Or(p.Catch, DefaultCatchPort)
	p.Refuse = cmp.Or(p.Refuse, DefaultRefusePort)
	return p
}

func (p Ports) bind(port uint16) uint16 {
	if p.Bind == nil {
		return port
	}
	return p.Bind(port)
}

// own are the gateway's listeners by port, in the order they are bound.
func (p Ports) own() []namedPort {
	return []namedPort{
		{"http-proxy", p.HTTPProxy},
		{"socks", p.SOCKS},
		{"dns", p.DNS},
		{"http", p.HTTP},
		{"tls", p.TLS},
		{"catch", p.Catch},
		{"refuse", p.Refuse},
	}
}

type namedPort struct {
	name string
	port uint16
}

// Server is a whole gateway: every listener of one Config on one address.
type Server struct {
	// Skipped are the host:port rules that get no TCP forward, each as
	// "RULE: why". The HTTP and SOCKS5 proxies still carry them.
	Skipped []string

	cfg   *Config
	addrs map[string]net.Addr
	units []unit

	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex
	serving bool
	closed  bool
	wg      sync.WaitGroup
}

// unit is one listener and the server that serves it.
type unit struct {
	name  string
	addr  net.Addr
	close func() error
	serve func() error
}

// Listen binds every listener of a gateway on addr, the gateway's address
// on the sandbox network, and only there (never on the unspecified address,
// so nothing on the outside network can use the gateway): the HTTP proxy,
// the SOCKS5 proxy, DNS over UDP and TCP on one port, HTTP routed by Host,
// TLS routed by server name, and a TCP forward for each allow rule that names
// one host on a port other than 80 and 443, when no other rule or listener
// wants that port (Server.Skipped lists the rest). Once Listen returns, the
// listeners accept connections; Serve serves them. If one cannot be bound,
// Listen closes those it bound and says which.
//
// Listen records addr with cfg: no upstream connection goes to it.
func Listen(cfg *Config, addr netip.Addr, ports Ports) (*Server, error) {
	if cfg == nil || cfg.Log == nil {
		return nil, errors.New("gateway: Config.Log is required")
	}
	addr = addr.Unmap()
	if !addr.IsValid() || addr.IsUnspecified() {
		return nil, fmt.Errorf("gateway: listening on %q: want the gateway's own address, not every address", addr)
	}
	ports = ports.withDefaults()
	seen := map[uint16]string{}
	for _, o := range ports.own() {
		if other, ok := seen[o.port]; ok {
			return nil, fmt.Errorf("gateway: the %s and %s listeners cannot share port %d", other, o.name, o.port)
		}
		seen[o.port] = o.name
	}
	forwards, skipped := planForwards(cfg.Policy, ports)

	s := &Server{Skipped: skipped, cfg: cfg, addrs: map[string]net.Addr{}}
	fail := func(name string, port uint16, err error) (*Server, error) {
		s.closeListeners()
		return nil, fmt.Errorf("gateway: listening for %s on %s: %w", name, netip.AddrPortFrom(addr, port), err)
	}

	listeners := []listener{
		{"http-proxy", ports.HTTPProxy, cfg.ServeHTTPProxy},
		{"socks", ports.SOCKS, cfg.ServeSOCKS},
		{"http", ports.HTTP, func(l net.Listener) error { return cfg.ServeHostHTTP(l, ports.HTTP) }},
		{"tls", ports.TLS, func(l net.Listener) error { return cfg.ServeTLS(l, ports.TLS) }},
	}
	if cfg.Kernel != nil && cfg.Bandwidth == 0 {
		cfg.virtual = newVirtualTable(cfg.Virtual)
		listeners = append(listeners, listener{"catch", ports.Catch, cfg.ServeCatch})
	} else {
		cfg.Kernel = nil
	}
	for _, f := range forwards {
		name := "tcp:" + net.JoinHostPort(f.host, strconv.Itoa(int(f.port)))
		listeners = append(listeners, listener{name, f.port, func(l net.Listener) error { return cfg.ServeForward(l, f.host, f.port) }})
	}
	for _, li := range listeners {
		port := ports.bind(li.port)
		l, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, port)))
		if err != nil {
			return fail(li.name, port, err)
		}
		s.addrs[li.name] = l.Addr()
		s.units = append(s.units, unit{name: li.name, addr: l.Addr(), close: l.Close, serve: func() error { return li.serve(l) }})
	}

	dns := &DNS{Config: cfg}
	if addr.Is4() {
		dns.Answer = addr
	} else {
		dns.Answer6 = addr
	}
	port := ports.bind(ports.DNS)
	dnsTCP, dnsUDP, err := listenDNS(addr, port)
	if err != nil {
		return fail("dns", port, err)
	}
	s.addrs["dns-tcp"], s.addrs["dns-udp"] = dnsTCP.Addr(), dnsUDP.LocalAddr()
	s.units = append(s.units,
		unit{name: "dns-tcp", addr: dnsTCP.Addr(), close: dnsTCP.Close, serve: func() error { return dns.ServeTCP(dnsTCP) }},
		unit{name: "dns-udp", addr: dnsUDP.LocalAddr(), close: dnsUDP.Close, serve: func() error { return dns.ServeUDP(dnsUDP) }},
	)
	cfg.addOwn(addr)
	return s, nil
}

// listener is a TCP listener of Listen: its name, its port before Bind, and
// its server.
type listener struct {
	name  string
	port  uint16
	serve func(net.Listener) error
}

// listenDNS binds TCP and UDP on the same port; port 0 picks one that is free
// for both.
func listenDNS(addr netip.Addr, port uint16) (*net.TCPListener, *net.UDPConn, error) {
	var err error
	for range 10 {
		var l *net.TCPListener
		l, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, port)))
		if err != nil {
			return nil, nil, err
		}
		bound := l.Addr().(*net.TCPAddr).AddrPort().Port()
		var pc *net.UDPConn
		pc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, bound)))
		if err == nil {
			return l, pc, nil
		}
		l.Close()
		if port != 0 {
			break // a port chosen by the caller: no other to try
		}
	}
	return nil, nil, err
}

// Serve serves every listener until Close, then returns nil once all have
// stopped. If one fails, Serve closes the others and returns its error.
func (s *Server) Serve() error {
	s.mu.Lock()
	if s.serving {
		s.mu.Unlock()
		return errors.New("gateway: Serve called twice")
	}
	s.serving = true
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	errs := make(chan error, len(s.units))
	for _, u := range s.units {
		s.wg.Go(func() {
			if err := u.serve(); err != nil {
				errs <- fmt.Errorf("gateway: %s on %s: %w", u.name, u.addr, err)
			}
		})
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case err := <-errs:
		s.closeListeners()
		<-done
		return err
	case <-done:
		select {
		case err := <-errs:
			return err
		default:
			return nil
		}
	}
}

// Close closes every listener, which closes every connection the servers
// accepted, and waits for Serve's servers to return.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	err := s.closeListeners()
	s.wg.Wait()
	s.cfg.stopIntercepting()
	return err
}

func (s *Server) closeListeners() error {
	s.closeOnce.Do(func() {
		var errs []error
		for _, u := range s.units {
			if err := u.close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, fmt.Errorf("closing %s: %w", u.name, err))
			}
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// Addrs are the bound addresses by listener: http-proxy, socks, dns-udp,
// dns-tcp, http, tls, and tcp:HOST:PORT for the forward of rule HOST:PORT.
func (s *Server) Addrs() map[string]net.Addr {
	return maps.Clone(s.addrs)
}

// forward is a TCP forward to be: the sandbox dials port on the gateway and
// reaches host:port.
type forward struct {
	host string
	port uint16
}

// planForwards chooses the TCP forwards of p's allow rules: a rule with a
// port other than 80 and 443 gets one when it names one host (no wildcard,
// no address), no other such rule names another host on its port, its port
// is none of the gateway's own, and the policy allows it. Every other such
// rule is skipped, with why, in the order of the rules.
func planForwards(p egress.Policy, ports Ports) ([]forward, []string) {
	own := map[uint16]string{}
	for _, o := range ports.own() {
		own[o.port] = o.name
	}
	// byPort are the rules that would have the sandbox dial the gateway on
	// each port: names, exact or wildcard (the DNS answers both with the
	// gateway's address).
	byPort := map[uint16][]egress.Rule{}
	for _, r := range p.Allow {
		if r.Port != 0 && r.Port != 80 && r.Port != 443 && r.Host != "" {
			byPort[r.Port] = append(byPort[r.Port], r)
		}
	}
	var (
		forwards []forward
		skipped  []string
		planned  = map[forward]bool{}
	)
	skip := func(r egress.Rule, why string) {
		skipped = append(skipped, r.Text+": "+why)
	}
	for _, r := range p.Allow {
		if r.Port == 0 || r.Port == 80 || r.Port == 443 {
			continue
		}
		port := strconv.Itoa(int(r.Port))
		switch {
		case r.Addr.IsValid():
			skip(r, "an address rule: the sandbox dials the address itself, so only the proxies carry it")
			continue
		case r.Wildcard:
			skip(r, "a wildcard names no single host to forward port "+port+" to")
			continue
		case own[r.Port] != "":
			skip(r, "port "+port+" is the gateway's "+own[r.Port]+" port")
			continue
		}
		if others := otherHosts(byPort[r.Port], r.Host); len(others) > 0 {
			skip(r, "port "+port+" is shared with "+strings.Join(others, ", ")+", and a forward carries one host per port")
			continue
		}
		if d := p.Decide(r.Host, r.Port); !d.Allowed {
			skip(r, d.Reason)
			continue
		}
		f := forward{host: r.Host, port: r.Port}
		if !planned[f] {
			planned[f] = true
			forwards = append(forwards, f)
		}
	}
	return forwards, skipped
}

// otherHosts are the rules among rules that name something other than host,
// as written.
func otherHosts(rules []egress.Rule, host string) []string {
	var out []string
	for _, r := range rules {
		if r.Wildcard || r.Host != host {
			if !slices.Contains(out, r.Text) {
				out = append(out, r.Text)
			}
		}
	}
	return out
}
