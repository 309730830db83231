package e2e

// The allowlist (network.mode allowlist) end to end. Each test stands up its
// own "internet": a network with probe servers on it, named by the engine's
// DNS aliases (allowed.test, denied.test, ...), with a certificate from a
// test CA; the sandbox's gateway goes out through that network
// (PROPIO_SANDBOX_GATEWAY_NETWORK). No packet goes to a public address and
// no real name is looked up.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/testenv"
	"go.yaml.in/yaml/v3"
)

// internet is a test's outside world.
type internet struct {
	t       *testing.T
	Network string
	CADir   string            // ca.pem, server.pem, server.key
	IP      map[string]string // server name -> its IPv4 address on the network
	IP6     map[string]string // server name -> its IPv6 address, when the network has IPv6
	ids     map[string]string
}

// servers are the internet's hosts and the names that lead to them.
var servers = map[string][]string{
	"alpha": {"allowed.test", "tcp.test"},
	"beta":  {"denied.test", "wild.test", "sub.wild.test", "blocked.wild.test"},
}

func newInternet(t *testing.T) *internet {
	t.Helper()
	requireEngine(t)
	in := &internet{t: t, Network: "propio-e2e-inet-" + randomID(), IP: map[string]string{}, IP6: map[string]string{}, ids: map[string]string{}}
	// IPv6 when the engine allows it on a user network, so the test can also
	// show that a sandbox has no IPv6 route out; plain IPv4 otherwise.
	v6 := fmt.Sprintf("fd%s:%s::/64", randomID()[:2], randomID()[:4])
	if _, err := docker("network", "create", "--label", "dev.propio-sandbox.e2e=1", "--ipv6", "--subnet", v6, in.Network); err != nil {
		if _, err := docker("network", "create", "--label", "dev.propio-sandbox.e2e=1", in.Network); err != nil {
			t.Fatalf("creating the test internet: %v", err)
		}
	}
	t.Cleanup(func() {
		for _, id := range in.ids {
			docker("rm", "-f", id)
		}
		testenv.RemoveNetwork(t, in.Network)
	})
	in.CADir = filepath.Join(t.TempDir(), "certs")
	if err := os.MkdirAll(in.CADir, 0o755); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, aliases := range servers {
		names = append(names, aliases...)
	}
	makeTestCA(t, in.CADir, append(names, "*.wild.test")...)
	for name, aliases := range servers {
		args := []string{"run", "-d", "--label", "dev.propio-sandbox.e2e=1", "--network", in.Network, "-v", in.CADir + ":/certs:ro"}
		for _, a := range aliases {
			args = append(args, "--network-alias", a)
		}
		id, err := docker(append(args, ProbeImage, "serve", name)...)
		if err != nil {
			t.Fatalf("starting server %s: %v", name, err)
		}
		in.ids[name] = strings.TrimSpace(id)
	}
	for name, id := range in.ids {
		in.waitLog(name, "serving "+name)
		ips, err := docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{.GlobalIPv6Address}}{{end}}", id)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(ips)
		in.IP[name] = f[0]
		if len(f) > 1 {
			in.IP6[name] = f[1]
		}
	}
	return in
}

// Logs is what a server printed: one line per connection, request and datagram.
func (in *internet) Logs(name string) string {
	out, err := docker("logs", in.ids[name])
	if err != nil {
		in.t.Fatalf("logs of %s: %v", name, err)
	}
	return out
}

func (in *internet) waitLog(name, want string) {
	in.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(in.Logs(name), want) {
		if time.Now().After(deadline) {
			in.t.Fatalf("server %s never printed %q:\n%s", name, want, in.Logs(name))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// running is an allowlist sandbox kept alive (its command sleeps) so that a
// test can run probes inside it with docker exec: the same network
// namespace, environment and DNS as the agent's own command.
type running struct {
	s       *sandbox
	cmd     *exec.Cmd
	done    chan Result
	Agent   string // container id
	Gateway string // the gateway's address on the sandbox network
}

func startAllowlist(t *testing.T, s *sandbox, in *internet, profileYAML string) *running {
	t.Helper()
	s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
	r := startRunning(t, s, profileYAML)
	// The container's environment, as the engine has it: any image (the
	// probe's, or the agent's, which has no /probe).
	env, err := docker("inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}", r.Agent)
	if err != nil {
		t.Fatal(err)
	}
	var gw string
	for _, kv := range strings.Split(env, "\n") {
		if strings.HasPrefix(kv, "HTTP_PROXY=") {
			gw = kv
		}
	}
	r.Gateway = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(gw), "HTTP_PROXY=http://"), ":3128")
	if _, err := netip.ParseAddr(r.Gateway); err != nil {
		t.Fatalf("HTTP_PROXY in the sandbox is %q", gw)
	}
	return r
}

// Probe runs the probe inside the sandbox and returns its output and whether
// it succeeded.
func (r *running) Probe(args ...string) (string, bool) {
	r.s.t.Helper()
	out, err := docker(append([]string{"exec", r.Agent, "/probe"}, args...)...)
	return out, err == nil
}

// Stop ends the launcher (SIGTERM) and returns how it ended; the sandbox,
// gateway and networks go with it.
func (r *running) Stop() Result {
	if r.cmd.Process != nil && r.cmd.ProcessState == nil {
		r.cmd.Process.Signal(os.Interrupt)
	}
	select {
	case res := <-r.done:
		r.done <- res
		return res
	case <-time.After(time.Minute):
		r.s.t.Error("the launcher did not end a minute after SIGINT")
		r.cmd.Process.Kill()
		return Result{Code: -1}
	}
}

// decisions reads the gateway's log through `propio-sandbox logs --json`.
func decisions(t *testing.T, s *sandbox, denied bool) []map[string]any {
	t.Helper()
	args := []string{"logs", "--json"}
	if denied {
		args = append(args, "--denied")
	}
	res := s.Run("", args...)
	if res.Code != 0 {
		t.Fatalf("logs:\n%s", res)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("logs --json line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

func logged(entries []map[string]any, via, host string, allowed bool) bool {
	for _, e := range entries {
		if e["via"] == via && e["host"] == host && e["allowed"] == allowed {
			return true
		}
	}
	return false
}

const allowlistProfile = `
network:
  mode: allowlist
  allow: [allowed.test, "*.wild.test", "tcp.test:22"]
  deny: [blocked.wild.test]
mounts:
  - {source: %s, target: /certs}
`

// TestAllowlist runs the allowlist tests twice: with the gateway forwarding
// allowed names in its kernel (the default), and relaying everything in user
// space (as it does under a bandwidth cap, set here high enough not to
// matter). A rootless engine's gateway relays in user space only (it runs
// as the user, in the user's mapping): the second covers it.
func TestAllowlist(t *testing.T) {
	t.Run("kernel", func(t *testing.T) {
		requireKernelForwarding(t)
		testAllowlist(t, true)
	})
	t.Run("user-space", func(t *testing.T) { testAllowlist(t, false) })
}

// requireKernelForwarding skips a test of the gateway's kernel forwarding
// on an engine where the gateway relays in user space only (a rootless one:
// the gateway runs as the user, in the user's mapping); its user-space
// variant covers that engine.
func requireKernelForwarding(t *testing.T) {
	t.Helper()
	requireEngine(t)
	if engineRootless(t) {
		t.Skip("the engine is rootless: its gateway relays in user space only (the user-space subtest)")
	}
}

func testAllowlist(t *testing.T, kernel bool) {
	s := newSandbox(t)
	in := newInternet(t)
	prof := fmt.Sprintf(allowlistProfile, in.CADir)
	if !kernel {
		prof = strings.Replace(prof, "  deny:", "  bandwidth: 10gbit\n  deny:", 1)
	}
	r := startAllowlist(t, s, in, prof)
	ca := "--cacert=/certs/ca.pem"
	t.Run("forwarding", func(t *testing.T) {
		want := "relayed in user space"
		if kernel {
			want = "forwarded by the kernel"
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, _ := docker("logs", gatewayContainer(t, s))
			if strings.Contains(out, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the gateway does not say its connections are %s:\n%s", want, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	allowed := []struct {
		name string
		args []string
		want string
	}{
		{"proxy http", []string{"fetch", "http://allowed.test/p1"}, "alpha http allowed.test /p1"},
		{"proxy https connect", []string{"fetch", ca, "https://allowed.test/p2"}, "alpha http allowed.test /p2"},
		{"socks5", []string{"fetch", "--socks", "http://allowed.test/p3"}, "alpha http allowed.test /p3"},
		{"transparent http by host", []string{"fetch", "--no-proxy", "http://allowed.test/t1"}, "alpha http allowed.test /t1"},
		{"transparent tls by sni", []string{"fetch", "--no-proxy", ca, "https://allowed.test/t2"}, "alpha http allowed.test /t2"},
		{"wildcard subdomain", []string{"fetch", "http://sub.wild.test/w"}, "beta http sub.wild.test /w"},
		{"wildcard subdomain transparent", []string{"fetch", "--no-proxy", ca, "https://sub.wild.test/w2"}, "beta http sub.wild.test /w2"},
		{"host:port rule as tcp", []string{"tcp", "tcp.test:22", "hello"}, "greeting: alpha tcp 22\necho: hello"},
	}
	for _, c := range allowed {
		t.Run("allowed/"+c.name, func(t *testing.T) {
			out, ok := r.Probe(c.args...)
			if !ok || !strings.Contains(out, c.want) {
				t.Fatalf("probe %v: ok=%v, want %q in:\n%s", c.args, ok, c.want, out)
			}
		})
	}

	// Denied through the proxy: a 403 that names the host and the profile
	// line to change. Denied transparently: the name does not resolve.
	denied := []struct {
		name, url, rule string
	}{
		{"unlisted name", "http://denied.test/", "no network.allow rule matches"},
		{"wildcard does not cover its base name", "http://wild.test/", "no network.allow rule matches"},
		{"deny beats allow", "http://blocked.wild.test/", `network.deny "blocked.wild.test"`},
		{"port rule allows only its port", "http://tcp.test:7/", "no network.allow rule matches"},
		{"metadata address", "http://169.254.169.254/latest/meta-data/", "always denied"},
		{"raw address of an outside server", "http://" + in.IP["alpha"] + "/", "raw addresses are denied"},
		{"the gateway's own proxy port", "http://" + r.Gateway + ":3128/", "raw addresses are denied"},
		// HTTP clients never send localhost to a proxy; SOCKS5 below does.
		{"loopback of the gateway", "http://localhost:3128/", ""},
	}
	for _, c := range denied {
		t.Run("denied/"+c.name, func(t *testing.T) {
			out, _ := r.Probe("fetch", c.url)
			if c.rule != "" && (!strings.Contains(out, "status 403") || !strings.Contains(out, c.rule) || !strings.Contains(out, "profile.yaml")) {
				t.Errorf("through the proxy: want a 403 naming %q and the profile, got:\n%s", c.rule, out)
			}
			if out, ok := r.Probe("fetch", "--socks", c.url); reached(out, ok) {
				t.Errorf("through SOCKS5: reached it:\n%s", out)
			}
			if out, ok := r.Probe("fetch", "--no-proxy", "--timeout=3s", c.url); reached(out, ok) {
				t.Errorf("without the proxy: reached it:\n%s", out)
			}
		})
	}
	t.Run("denied/tcp port without a rule", func(t *testing.T) {
		if out, ok := r.Probe("tcp", "tcp.test:7", "hello"); ok {
			t.Errorf("reached port 7:\n%s", out)
		}
	})
	t.Run("denied/name does not resolve", func(t *testing.T) {
		out, ok := r.Probe("resolve", "denied.test")
		if ok {
			t.Errorf("denied.test resolved:\n%s", out)
		}
		out, ok = r.Probe("resolve", "allowed.test")
		got, err := netip.ParseAddr(strings.TrimSpace(out))
		switch {
		case !ok || err != nil:
			t.Errorf("allowed.test resolves to %q", out)
		case kernel:
			// One of the gateway's virtual addresses: the upper half of
			// the sandbox network, which no container has.
			virtual := netip.PrefixFrom(netip.MustParseAddr(r.Gateway), 24).Masked()
			if !virtual.Contains(got) || got.As4()[3] < 128 {
				t.Errorf("allowed.test resolves to %s, want a virtual address in the upper half of %s", got, virtual)
			}
		case got.String() != r.Gateway:
			t.Errorf("allowed.test resolves to %s, want the gateway %s", got, r.Gateway)
		}
	})

	// Bypass attempts.
	t.Run("bypass/direct to an outside server's address", func(t *testing.T) {
		for _, args := range [][]string{
			{"fetch", "--no-proxy", "--timeout=3s", "http://" + in.IP["alpha"] + "/direct"},
			{"tcp", "--timeout=3s", in.IP["alpha"] + ":22", "direct"},
		} {
			if out, ok := r.Probe(args...); ok {
				t.Errorf("%v reached the server:\n%s", args, out)
			}
		}
		if strings.Contains(in.Logs("alpha"), "/direct") {
			t.Errorf("the server saw the direct request:\n%s", in.Logs("alpha"))
		}
	})
	t.Run("bypass/dns to another resolver", func(t *testing.T) {
		// The outside server answers UDP on 53; no datagram may reach it.
		if out, ok := r.Probe("dns", "--timeout=2s", in.IP["alpha"]+":53", "allowed.test"); ok {
			t.Errorf("got an answer from an outside resolver:\n%s", out)
		}
		// The engine's own resolver in the sandbox forwards only to the gateway.
		out, _ := r.Probe("dns", "--timeout=3s", "127.0.0.11:53", "denied.test")
		if len(answers(out)) > 0 {
			t.Errorf("the engine's resolver answered denied.test:\n%s", out)
		}
		// Podman's resolver (aardvark-dns) listens on the sandbox network's
		// bridge, which has an address there: the fence keeps it out of reach.
		subnet, err := docker("network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}}{{end}}", sandboxNetwork(t, s))
		if err != nil {
			t.Fatal(err)
		}
		bridge := netip.MustParsePrefix(strings.TrimSpace(subnet)).Masked().Addr().Next()
		out, _ = r.Probe("dns", "--timeout=3s", bridge.String()+":53", "allowed.test")
		if len(answers(out)) > 0 || strings.Contains(out, "rcode") {
			t.Errorf("a resolver on the sandbox network's bridge %s answered:\n%s", bridge, out)
		}
	})
	t.Run("bypass/dns tunnelling through the gateway", func(t *testing.T) {
		name := "c2VjcmV0LWRhdGE.exfil.denied.test"
		// A denied name does not exist, for every type of query.
		out, _ := r.Probe("dns", r.Gateway+":53", name, "A")
		if !strings.Contains(out, "rcode NXDOMAIN") || len(answers(out)) > 0 {
			t.Errorf("the gateway answered a query for a denied name:\n%s", out)
		}
		out, _ = r.Probe("dns", r.Gateway+":53", name, "AAAA")
		if !strings.Contains(out, "rcode NXDOMAIN") || len(answers(out)) > 0 {
			t.Errorf("the gateway answered an AAAA query for a denied name:\n%s", out)
		}
	})
	t.Run("bypass/metadata address direct", func(t *testing.T) {
		if out, ok := r.Probe("tcp", "--timeout=3s", "169.254.169.254:80", "x"); ok {
			t.Errorf("reached the metadata address:\n%s", out)
		}
	})
	t.Run("bypass/ipv6", func(t *testing.T) {
		target := "[fd00:ec2::254]:80"
		if ip := in.IP6["alpha"]; ip != "" {
			target = "[" + ip + "]:22"
		}
		if out, ok := r.Probe("tcp", "--timeout=3s", target, "v6"); ok {
			t.Errorf("reached %s over IPv6:\n%s", target, out)
		}
		out, _ := r.Probe("dns", r.Gateway+":53", "allowed.test", "AAAA")
		if len(answers(out)) > 0 {
			t.Errorf("the gateway gave an IPv6 address:\n%s", out)
		}
	})
	t.Run("bypass/gateway control ports", func(t *testing.T) {
		for _, port := range []string{"2375", "2376", "8080", "9090", "8443"} {
			if out, ok := r.Probe("connect", r.Gateway+":"+port); ok {
				t.Errorf("port %s of the gateway answers:\n%s", port, out)
			}
		}
		// Nothing on the outside network can use the gateway as a proxy: its
		// listeners are bound to its sandbox address only.
		ip, err := docker("inspect", "-f", `{{(index .NetworkSettings.Networks "`+in.Network+`").IPAddress}}`, gatewayContainer(t, s))
		if err != nil || strings.TrimSpace(ip) == "" {
			t.Fatalf("the gateway's outside address: %v %q", err, ip)
		}
		// By what it printed: Podman before 4.6 reports exit code 0 for a
		// container run with --rm (containers/podman#18889).
		out, err := docker("run", "--rm", "--network", in.Network, ProbeImage, "connect", strings.TrimSpace(ip)+":3128")
		if err == nil && strings.Contains(out, "connected:") {
			t.Errorf("the gateway's proxy answers on the outside network:\n%s", out)
		}
	})
	t.Run("bypass/the host", func(t *testing.T) {
		// A service of the host listening on all addresses, as dev servers,
		// databases and model servers often do. The sandbox must not reach it
		// through its network's bridge, nor through the default bridge.
		l, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var got atomic.Int32
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				got.Add(1)
				c.Write([]byte("host service\n"))
				c.Close()
			}
		}()
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		subnet, err := docker("network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}}{{end}}", sandboxNetwork(t, s))
		if err != nil {
			t.Fatal(err)
		}
		bridge := netip.MustParsePrefix(strings.TrimSpace(subnet)).Masked().Addr().Next() // the bridge's address, if it had one
		// The host as the engines name it (Podman's name is in the
		// sandbox's /etc/hosts), slirp4netns's way to the host's loopback
		// (a rootless Podman's networks go out through it), and each of
		// the host's own addresses.
		hosts := []string{bridge.String(), "172.17.0.1", "host.docker.internal", "host.containers.internal", "10.0.2.2"}
		hosts = append(hosts, hostAddrs(t)...)
		// At once: where nothing answers, each waits out its timeout.
		var wg sync.WaitGroup
		for _, host := range hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if out, ok := r.Probe("connect", "--timeout=2s", host+":"+port); ok {
					t.Errorf("reached the host's service at %s:\n%s", host, out)
				}
			}()
		}
		wg.Wait()
		if n := got.Load(); n != 0 {
			t.Errorf("the host's service got %d connections from the sandbox", n)
		}
	})
	t.Run("bypass/udp to an outside server", func(t *testing.T) {
		if out, ok := r.Probe("udp", "--timeout=2s", in.IP["alpha"]+":9", "udp-bypass"); ok {
			t.Errorf("got a UDP reply:\n%s", out)
		}
		if out, ok := r.Probe("udp", "--timeout=2s", "allowed.test:9", "udp-bypass"); ok {
			t.Errorf("got a UDP reply through the allowed name:\n%s", out)
		}
		if logs := in.Logs("alpha"); strings.Contains(logs, "udp-bypass") {
			t.Errorf("a datagram reached the server:\n%s", logs)
		}
	})

	if kernel {
		t.Run("bypass/route through the gateway", func(t *testing.T) {
			// An agent that could route through the gateway (here the test
			// gives its network namespace a default route via the gateway,
			// as raw packets to the gateway's MAC address would) still
			// reaches nothing: the gateway's kernel forwards only the
			// connections it translated itself.
			if os.Geteuid() != 0 {
				t.Skip("needs root on the engine's host to enter the sandbox's network namespace")
			}
			if _, err := exec.LookPath("nsenter"); err != nil {
				t.Skip("needs nsenter: ", err)
			}
			pid, err := docker("inspect", "-f", "{{.State.Pid}}", r.Agent)
			if err != nil || strings.TrimSpace(pid) == "0" {
				t.Skipf("no process of the sandbox on this host (a remote engine?): %v", err)
			}
			ns := "--net=/proc/" + strings.TrimSpace(pid) + "/ns/net"
			if out, err := exec.Command("nsenter", ns, "ip", "route", "replace", "default", "via", r.Gateway).CombinedOutput(); err != nil {
				t.Skipf("cannot add the route: %v %s", err, out)
			}
			defer exec.Command("nsenter", ns, "ip", "route", "del", "default").Run()
			for _, args := range [][]string{
				{"tcp", "--timeout=3s", in.IP["alpha"] + ":22", "routed"},
				{"fetch", "--no-proxy", "--timeout=3s", "http://" + in.IP["alpha"] + "/routed"},
				{"udp", "--timeout=2s", in.IP["alpha"] + ":9", "routed"},
			} {
				if out, ok := r.Probe(args...); ok {
					t.Errorf("%v reached the server through the gateway's routing:\n%s", args, out)
				}
			}
			if logs := in.Logs("alpha"); strings.Contains(logs, "routed") {
				t.Errorf("the server saw a routed packet:\n%s", logs)
			}
		})
	}

	// Every decision is in the log, on the host, while the sandbox runs.
	t.Run("log", func(t *testing.T) {
		all := decisions(t, s, false)
		transparent := []struct {
			via, host string
			allowed   bool
		}{{"host", "allowed.test", true}, {"sni", "allowed.test", true}, {"tcp", "tcp.test", true}}
		if kernel {
			// The kernel forwards them; its connection tracking reports
			// each once it has ended, within seconds.
			transparent = []struct {
				via, host string
				allowed   bool
			}{{"nat", "allowed.test", true}, {"nat", "sub.wild.test", true}, {"nat", "tcp.test", true}, {"nat", "tcp.test", false}}
			deadline := time.Now().Add(15 * time.Second)
			for !logged(all, "nat", "tcp.test", true) && time.Now().Before(deadline) {
				time.Sleep(500 * time.Millisecond)
				all = decisions(t, s, false)
			}
		}
		for _, want := range append([]struct {
			via, host string
			allowed   bool
		}{
			{"http", "allowed.test", true}, {"connect", "allowed.test", true}, {"socks5", "allowed.test", true},
			{"dns", "allowed.test", true}, {"http", "denied.test", false}, {"dns", "denied.test", false},
			{"http", "blocked.wild.test", false},
		}, transparent...) {
			if !logged(all, want.via, want.host, want.allowed) {
				t.Errorf("no log entry via %s for %s allowed=%v", want.via, want.host, want.allowed)
			}
		}
		for _, e := range decisions(t, s, true) {
			if e["allowed"] != false {
				t.Errorf("logs --denied shows an allowed entry: %v", e)
			}
		}
		for _, e := range all {
			if (e["via"] == "connect" || e["via"] == "nat") && e["allowed"] == true && e["bytes_down"].(float64) <= 0 {
				t.Errorf("allowed %s logged no bytes: %v", e["via"], e)
			}
		}
	})

	if res := r.Stop(); res.Code != 130 {
		t.Errorf("launcher after SIGINT: %s", res)
	}
}

// hostAddrs are this host's own IPv4 addresses but loopback's.
func hostAddrs(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			out = append(out, p.Addr().String())
		}
	}
	return out
}

// reached reports whether a fetch got a successful answer (a refusal by the
// gateway is an answer too, but not a 2xx one).
func reached(out string, ok bool) bool { return ok && strings.Contains(out, "status 2") }

// answers are the addresses in the probe's dns output.
func answers(out string) []string {
	var addrs []string
	for _, line := range strings.Split(out, "\n") {
		if _, err := netip.ParseAddr(strings.TrimSpace(line)); err == nil {
			addrs = append(addrs, strings.TrimSpace(line))
		}
	}
	return addrs
}

// sandboxNetwork is the id of the sandbox's internal network.
func sandboxNetwork(t *testing.T, s *sandbox) string {
	t.Helper()
	out, err := docker("network", "ls", "-q", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace, "--filter", "name=_sandbox")
	if err != nil || len(strings.Fields(out)) != 1 {
		t.Fatalf("the sandbox network: %v %q", err, out)
	}
	return strings.TrimSpace(out)
}

// gatewayContainer is the id of the sandbox's gateway container.
func gatewayContainer(t *testing.T, s *sandbox) string {
	t.Helper()
	out, err := docker("ps", "-q", "--filter", "label=dev.propio-sandbox.workspace="+s.Workspace, "--filter", "label=com.docker.compose.service=gateway")
	if err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("no gateway container: %v", err)
	}
	return strings.TrimSpace(out)
}

// TestBuiltinAllowlistProfiles renders and runs the built-in strict and
// standard profiles (the image is propio-sandbox/agent, which .ci/run
// builds): the gateway and both networks are in the render; inside, the proxy
// variables point at the gateway, a request to a name no rule allows gets the
// gateway's 403, the root filesystem is read-only, a secrets file reads empty,
// and nothing of the user's git or SSH setup is there.
func TestBuiltinAllowlistProfiles(t *testing.T) {
	for _, name := range []string{"strict", "standard"} {
		t.Run(name, func(t *testing.T) {
			s := newSandbox(t)
			if out, err := docker("image", "inspect", "propio-sandbox/agent:latest"); err != nil {
				dockerfileSkipOrFail(t, "the agent image is missing (build it with `propio-sandbox build`, as .ci/run does): %v %s", err, firstLine(out))
			}
			res := s.Run("", "render", "-p", name)
			if res.Code != 0 {
				t.Fatalf("render:\n%s", res)
			}
			var doc struct {
				Services map[string]struct {
					Networks map[string]any `yaml:"networks"`
				} `yaml:"services"`
				Networks map[string]struct {
					Internal bool `yaml:"internal"`
				} `yaml:"networks"`
			}
			if err := yaml.Unmarshal([]byte(res.Stdout), &doc); err != nil {
				t.Fatalf("render output: %v\n%s", err, res.Stdout)
			}
			if _, ok := doc.Services["gateway"]; !ok || !doc.Networks["sandbox"].Internal || len(doc.Services["agent"].Networks) != 1 || len(doc.Services["gateway"].Networks) != 2 {
				t.Fatalf("render does not show the agent on the internal network and the gateway on both:\n%s", res.Stdout)
			}
			if _, ok := doc.Networks["outside"]; !ok {
				t.Fatalf("render shows no outside network:\n%s", res.Stdout)
			}

			os.WriteFile(filepath.Join(s.Workspace, ".env"), []byte("API_TOKEN=secret-in-dotenv\n"), 0o644)
			os.WriteFile(filepath.Join(s.Home, ".gitconfig"), []byte("[user]\n\tname = Host User\n"), 0o644)
			s.Env = append(s.Env, "SSH_AUTH_SOCK=/tmp/ssh-agent.sock", "GITHUB_TOKEN=ghp_should_not_pass", "ANTHROPIC_API_KEY=sk-test-passed")
			script := `echo "proxy=$HTTPS_PROXY"
echo "ssh=${SSH_AUTH_SOCK:-unset} gh=${GITHUB_TOKEN:-unset} key=${ANTHROPIC_API_KEY%-*}"
echo "dotenv=[$(cat .env)]"
git config --global user.name || echo "no git identity"
echo "denied=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 http://denied.test/)"
curl -s --max-time 10 http://denied.test/ | grep -e 'init --extends' -e '- "denied.test"'
touch /usr/local/probe-write 2>&1 || true`
			res = s.Run("", "-p", name, "--", "bash", "-c", script)
			if res.Code != 0 {
				t.Fatalf("run -p %s:\n%s", name, res)
			}
			// The provider key is brokered: the sandbox holds its sentinel.
			for _, want := range []string{"proxy=http://198.1", "ssh=unset gh=unset key=propio-sentinel-ANTHROPIC_API_KEY\n", "dotenv=[]", "no git identity", "denied=403", "Read-only file system",
				// A built-in cannot be edited: the 403 says how to make a
				// profile that extends it, and the line to add.
				"    propio-sandbox init --extends " + name + "\n", `        - "denied.test"`} {
				if !strings.Contains(res.Stdout, want) {
					t.Errorf("run -p %s: want %q in:\n%s", name, want, res)
				}
			}
			if strings.Contains(res.Stdout+res.Stderr, "sk-test-passed") {
				t.Errorf("a passed secret's value appears in the output:\n%s", res)
			}
			if !logged(decisions(t, s, true), "http", "denied.test", false) {
				t.Errorf("logs --denied has no entry for denied.test")
			}
		})
	}
}

// TestAllowlistParallel: allowlist sandboxes started at once in one directory
// each get a network of their own and reach the allowed server through their
// own gateway; nothing of any remains.
func TestAllowlistParallel(t *testing.T) {
	s := newSandbox(t)
	in := newInternet(t)
	s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")
	const n = 4
	results := s.RunAll(n, "run", "-p", p, "--", "fetch", "--no-proxy", "http://allowed.test/parallel")
	for i, r := range results {
		if r.Code != 0 || !strings.Contains(r.Stdout, "alpha http allowed.test /parallel") {
			t.Errorf("run %d:\n%s", i, r)
		}
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("the launchers exited while these remained: %v", left)
	}
	if got := strings.Count(in.Logs("alpha"), "/parallel"); got != n {
		t.Errorf("the server saw %d requests, want %d", got, n)
	}
}

// TestAllowlistForeignNetwork: a network that has the name of the sandbox's
// network, which the launch did not make (a network of the user's, here one
// with a way out), is not joined: the run is refused, naming the network
// and what to do, before any container is made; the network is left as it
// was.
func TestAllowlistForeignNetwork(t *testing.T) {
	s := newSandbox(t)
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")
	network := generator.ProjectName(s.Workspace, "") + "_" + generator.SandboxNetwork
	if out, err := docker("network", "create", "--label", "dev.propio-sandbox.e2e=1", network); err != nil {
		t.Fatalf("making the user's network: %v: %s", err, out)
	}
	t.Cleanup(func() { testenv.RemoveNetwork(t, network) })
	r := s.Run("", "run", "-p", p, "--", "id")
	if r.Code == 0 || !strings.Contains(r.Stderr, "network "+network+" exists already, made by something other than propio-sandbox") || !strings.Contains(r.Stderr, "docker network rm "+network) {
		t.Fatalf("a run whose network name is taken by the user's network:\n%s", r)
	}
	if strings.Contains(r.Stdout, "uid=") {
		t.Errorf("the sandbox's command ran:\n%s", r)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	attached, err := docker("network", "inspect", "-f", "{{len .Containers}} {{.Internal}}", network)
	if err != nil || strings.TrimSpace(attached) != "0 false" {
		t.Errorf("the user's network after the run: %q, %v; want it as made (no container, not internal)", attached, err)
	}
}

// TestAllowlistKilledLauncher: what a SIGKILLed launcher (and its watchdog,
// killed first: else it removes all of it at once, TestDiskKilledLauncher)
// leaves of an allowlist sandbox (the gateway as well as the agent, on Podman the holder
// of its network namespace, and both networks) is removed by gc.
func TestAllowlistKilledLauncher(t *testing.T) {
	s := newSandbox(t)
	p := s.Profile("network:\n  mode: allowlist\n  allow: [allowed.test]\n")
	l := cleanupStart(t, s, "run", "-p", p, "--", "sleep", "1m")
	l.waitStdout(t, "ready", time.Minute)
	killWatchdog(t, l.cmd.Process.Pid)
	l.signal(t, syscall.SIGKILL)
	l.wait(t, time.Minute)
	left := s.Leftovers()
	var containers, networks int
	for _, x := range left {
		switch {
		case strings.HasPrefix(x, "container "):
			containers++
		case strings.HasPrefix(x, "network "):
			networks++
		}
	}
	want := 2 // the agent and the gateway
	if testenv.EnginePodman(t) {
		want = 3 // and the holder of the agent's fenced network namespace
	}
	if containers != want || networks != 2 {
		t.Fatalf("want the agent, the gateway (and on Podman the netns holder) and both networks left by the killed launcher, found %v", left)
	}
	if r := s.Run("", "gc"); r.Code != 0 {
		t.Fatalf("gc:\n%s", r)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Errorf("gc left %v", left)
	}
}
