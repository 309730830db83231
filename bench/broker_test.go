package bench

// What brokering costs: the same TLS server, the same allowlist sandbox,
// two names. data.test is a secret's host: the gateway terminates the
// sandbox's TLS with the run's CA, puts the value in place of the sentinel
// and sends each request on over TLS of its own (the transparent path: its
// DNS answers its own address). pass.test is allowed and nothing more: the
// gateway's kernel forwards the connection (a virtual address), and the
// sandbox's TLS goes to the server untouched. Both requests carry the
// sentinel as their bearer token.
//
// Throughput: 100 MB downloads, each on a new connection, timed by the
// probe inside the sandbox, perRound a round per arm, the arms alternating
// in the reverse order every other round; medians, and the ratio with a 95%
// bootstrap interval. Target: the brokered path at least BrokerThroughput of
// the pass-through one. Latency: requests on new connections (TLS
// handshake and all), p50 and p99 per sample; target: under BrokerLatency
// added at p50. The only server is the one the benchmark starts.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/testenv"
)

const (
	// BrokerThroughput is the lowest acceptable throughput of a brokered
	// host, as a share of the pass-through path's.
	BrokerThroughput = 0.8
	// BrokerLatency is the most brokering may add to a request at p50.
	BrokerLatency = 2 * time.Millisecond
)

func TestBrokerCost(t *testing.T) {
	rounds := min(benchRounds(t, "broker benchmark", "about two minutes", 10), 50)
	launcher := testenv.RequireEngine(t)
	if testenv.EnginePodman(t) {
		t.Skip("broker benchmark: network.mode allowlist runs on Docker only")
	}
	base := t.TempDir()
	if real, err := filepath.EvalSymlinks(base); err == nil {
		base = real
	}
	certs := filepath.Join(base, "certs")
	writeBenchCA(t, certs, "data.test", "pass.test")
	inet := "propio-bench-broker-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	mustDocker(t, "network", "create", "--label", "dev.propio-sandbox.e2e=1", inet)
	t.Cleanup(func() { testenv.RemoveNetwork(t, inet) })
	server := strings.TrimSpace(mustDocker(t, "run", "-d", "--label", "dev.propio-sandbox.e2e=1", "--network", inet,
		"--network-alias", "data.test", "--network-alias", "pass.test", "-v", certs+":/certs:ro", testenv.ProbeImage, "serve", "data"))
	t.Cleanup(func() { testenv.Docker("rm", "-f", server) })

	home := filepath.Join(base, "home")
	os.MkdirAll(home, 0o755)
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"), "XDG_STATE_HOME=" + filepath.Join(home, ".local", "state"),
		"PROPIO_SANDBOX_GATEWAY_NETWORK=" + inet, "BENCH_TOKEN=bench-real-value",
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		env = append(env, "DOCKER_HOST="+h)
	}
	profile := fmt.Sprintf(`image: %s
network:
  mode: allowlist
  allow: [data.test, pass.test]
  upstream_ca: %s/ca.pem
secrets:
  TOKEN: {from: {env: BENCH_TOKEN}, hosts: [data.test]}
mounts:
  - {source: %s, target: /certs}
`, testenv.ProbeImage, certs, certs)
	sb := startSandbox(t, launcher, filepath.Join(base, "ws"), profile, env)

	// Each arm is the path it says: data.test answered with the gateway's
	// own address (its listeners open it), pass.test with a virtual one
	// (the kernel forwards it); and the server gets the real value from
	// the first, the sentinel from the second.
	for name, virtual := range map[string]bool{"data.test": false, "pass.test": true} {
		a, err := netip.ParseAddr(strings.TrimSpace(execProbe(t, sb.agent, "resolve", name)))
		if err != nil || generator.VirtualRange(netip.PrefixFrom(a, 24).Masked()).Contains(a) != virtual {
			t.Fatalf("%s resolves to %v (%v): want a virtual address %v", name, a, err, virtual)
		}
	}
	execProbe(t, sb.agent, "fetch", "--no-proxy", "--fail", "--bearer-env", "TOKEN", "https://data.test/h/brokered")
	execProbe(t, sb.agent, "fetch", "--no-proxy", "--fail", "--cacert", "/certs/ca.pem", "--bearer-env", "TOKEN", "https://pass.test/h/passed")
	logs := mustDocker(t, "logs", server)
	if !strings.Contains(logs, `/h/brokered authorization="Bearer bench-real-value"`) || !strings.Contains(logs, `/h/passed authorization="Bearer propio-sentinel-TOKEN-`) {
		t.Fatalf("the server did not get the real value from data.test and the sentinel from pass.test:\n%s", logs)
	}

	bytesPath := "/bytes/" + strconv.Itoa(downloadBytes)
	arms := []*brokerArm{
		// Each client trusts the one CA of its server: the run's, the
		// benchmark's; both speak HTTP/1.1, as the probe does with a CA of
		// its own.
		{name: "brokered (TLS opened by the gateway)", url: "https://data.test", flags: []string{"--no-proxy", "--bearer-env", "TOKEN", "--cacert", "/run/propio-sandbox-ca/ca.pem"}},
		{name: "pass-through (kernel-forwarded TLS)", url: "https://pass.test", flags: []string{"--no-proxy", "--bearer-env", "TOKEN", "--cacert", "/certs/ca.pem"}},
	}
	for _, a := range arms { // warm each path once
		a.download(t, sb.agent, bytesPath, 1)
		a.latency(t, sb.agent)
	}
	for r := range rounds {
		order := slices.Clone(arms)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, a := range order {
			a.sec = append(a.sec, a.download(t, sb.agent, bytesPath, perRound)...)
		}
		for _, a := range order {
			p50, p99 := a.latency(t, sb.agent)
			a.p50, a.p99 = append(a.p50, p50), append(a.p99, p99)
		}
	}
	sb.stop()

	var b strings.Builder
	fmt.Fprintf(&b, "brokering, %d rounds of %d downloads of %d MB per arm, arms alternating; medians, [95%% bootstrap interval]\n", rounds, perRound, downloadBytes>>20)
	for _, a := range arms {
		fmt.Fprintf(&b, "  %-38s %5.0f MB/s  (middle half %.0f..%.0f)\n", a.name, mbps(medianF(a.sec)), mbps(quantile(a.sec, 0.75)), mbps(quantile(a.sec, 0.25)))
	}
	thr, lo, hi := ratio(arms[1].sec, arms[0].sec)
	fmt.Fprintf(&b, "throughput brokered / pass-through: %.3fx [%.3f..%.3f] (target >= %.2fx)\n", thr, lo, hi, BrokerThroughput)
	added50 := medianF(arms[0].p50) - medianF(arms[1].p50)
	fmt.Fprintf(&b, "latency, %d requests on new connections, p50/p99 in us: brokered %.0f/%.0f, pass-through %.0f/%.0f: added %.0f/%.0f (target p50 < %.0f)",
		latencyRequests, medianF(arms[0].p50), medianF(arms[0].p99), medianF(arms[1].p50), medianF(arms[1].p99),
		added50, medianF(arms[0].p99)-medianF(arms[1].p99), float64(BrokerLatency/time.Microsecond))
	t.Logf("\n%s", b.String())
	if thr < BrokerThroughput {
		t.Errorf("brokered throughput %.3fx the pass-through path's, below the target %.2fx", thr, BrokerThroughput)
	}
	if added50 >= float64(BrokerLatency/time.Microsecond) {
		t.Errorf("brokering adds %.0f us at p50, over the target %v", added50, BrokerLatency)
	}
}

// brokerArm is one path to the server, and what it measured.
type brokerArm struct {
	name, url string
	flags     []string
	sec       []float64 // seconds per download
	p50, p99  []float64 // microseconds per latency sample
}

func (a *brokerArm) download(t *testing.T, container, path string, n int) []float64 {
	t.Helper()
	out := execProbe(t, container, append(append([]string{"download"}, a.flags...), a.url+path, strconv.Itoa(n))...)
	var sec []float64
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[1] != strconv.Itoa(downloadBytes) {
			t.Fatalf("%s: download output %q", a.name, line)
		}
		s, err := strconv.ParseFloat(f[3], 64)
		if err != nil {
			t.Fatal(err)
		}
		sec = append(sec, s)
	}
	if len(sec) != n {
		t.Fatalf("%s: %d downloads measured, not %d", a.name, len(sec), n)
	}
	return sec
}

func (a *brokerArm) latency(t *testing.T, container string) (p50, p99 float64) {
	t.Helper()
	return latency(t, container, a.url+"/x", a.flags...)
}

// writeBenchCA writes a CA (dir/ca.pem) and a server certificate for names
// signed by it (dir/server.pem, dir/server.key), readable by the server's
// user, for an hour.
func writeBenchCA(t *testing.T, dir string, names ...string) {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "propio-sandbox bench CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	os.MkdirAll(dir, 0o755)
	os.Chmod(dir, 0o755)
	for name, block := range map[string]*pem.Block{
		"ca.pem": {Type: "CERTIFICATE", Bytes: caDER}, "server.pem": {Type: "CERTIFICATE", Bytes: der}, "server.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(block), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, 0o644)
	}
}
