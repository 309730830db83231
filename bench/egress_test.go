package bench

// The allowlist gateway's cost, measured side by side in one run:
//   - throughput: a 100 MB download by a sandbox through the gateway (the
//     transparent path: DNS to the gateway, HTTP routed by Host) against the
//     same download by a container on the same outside network, directly;
//     once as fast as this machine can (the target applies to this one), and
//     once from a server paced at 1 Gbit/s, as over a real link;
//   - latency: sequential requests on new connections, p50 and p99, through
//     the gateway against directly; the difference is what the gateway adds;
//   - launch: `propio-sandbox run -- exit 0` with network.mode allowlist
//     against `docker run --rm`.
// Targets: throughput at least 0.9x direct, p50 added latency under 1 ms.
// Both arms run the same probe binary, started with docker exec in a
// container that is already running, and alternate, so a slow moment of the
// machine falls on both. The only server is one the benchmark starts.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

const (
	// downloadBytes is the size of one throughput transfer.
	downloadBytes = 100 << 20
	// latencyRequests is how many requests one latency sample makes.
	latencyRequests = 200
	// ThroughputTarget is the lowest acceptable gateway/direct throughput.
	ThroughputTarget = 0.9
	// LatencyTarget is the highest acceptable p50 latency the gateway adds.
	LatencyTarget = time.Millisecond
	// linkRate paces the second throughput measurement as a 1 Gbit/s link
	// would: the gateway against a link, rather than against the memory
	// bandwidth of this machine.
	linkRate = 125_000_000
)

func TestEgress(t *testing.T) {
	if os.Getenv("PROPIO_BENCH") != "1" {
		t.Skip("egress benchmark: set PROPIO_BENCH=1 to run it (about a minute)")
	}
	rounds := 5
	if v := os.Getenv("PROPIO_BENCH_N"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			rounds = min(n, 20)
		}
	}
	launcher := testenv.RequireEngine(t)
	net := "propio-bench-inet-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	mustDocker(t, "network", "create", "--label", "dev.propio-sandbox.e2e=1", net)
	t.Cleanup(func() { testenv.Docker("network", "rm", net) })
	server := strings.TrimSpace(mustDocker(t, "run", "-d", "--label", "dev.propio-sandbox.e2e=1", "--network", net, "--network-alias", "data.test", testenv.ProbeImage, "serve", "data"))
	t.Cleanup(func() { testenv.Docker("rm", "-f", server) })
	direct := strings.TrimSpace(mustDocker(t, "run", "-d", "--label", "dev.propio-sandbox.e2e=1", "--network", net, testenv.ProbeImage, "sleep", "30m"))
	t.Cleanup(func() { testenv.Docker("rm", "-f", direct) })

	// The sandbox: allowlist of data.test, its gateway out through net.
	base := t.TempDir()
	if real, err := filepath.EvalSymlinks(base); err == nil {
		base = real
	}
	ws, home := filepath.Join(base, "workspace"), filepath.Join(base, "home")
	for _, d := range []string{ws, home} {
		os.MkdirAll(d, 0o755)
	}
	prof := filepath.Join(home, "allowlist.yaml")
	os.WriteFile(prof, []byte("image: "+testenv.ProbeImage+"\nnetwork:\n  mode: allowlist\n  allow: [data.test]\n"), 0o644)
	launchEnv := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"), "XDG_STATE_HOME=" + filepath.Join(home, ".local", "state"),
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		launchEnv = append(launchEnv, "DOCKER_HOST="+h)
	}
	// The measured sandbox goes out through the benchmark's network; the
	// launched ones get their own, as a user's would.
	env := append(slices.Clip(launchEnv), "PROPIO_SANDBOX_GATEWAY_NETWORK="+net)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, launcher, "run", "-p", prof, "--", "sleep", "30m")
	run.Dir, run.Env = ws, env
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Process.Signal(os.Interrupt); run.Wait() })
	agent := waitAgent(t, ws)

	url := "http://data.test/bytes/" + strconv.Itoa(downloadBytes)
	// Warm both arms (and the gateway's and server's code paths) once.
	execProbe(t, agent, "download", "--no-proxy", url)
	execProbe(t, direct, "download", "--no-proxy", url)
	execProbe(t, agent, "latency", "20", "--no-proxy", "http://data.test/x")
	execProbe(t, direct, "latency", "20", "--no-proxy", "http://data.test/x")

	var viaSec, directSec, viaLink, directLink []float64
	linkURL := url + "?rate=" + strconv.Itoa(linkRate)
	var viaP50, viaP99, dirP50, dirP99, proxyP50, proxyP99 []float64
	for range rounds {
		viaSec = append(viaSec, downloadSeconds(t, agent, url))
		directSec = append(directSec, downloadSeconds(t, direct, url))
		viaLink = append(viaLink, downloadSeconds(t, agent, linkURL))
		directLink = append(directLink, downloadSeconds(t, direct, linkURL))
		p50, p99 := latency(t, agent, "--no-proxy")
		viaP50, viaP99 = append(viaP50, p50), append(viaP99, p99)
		p50, p99 = latency(t, direct, "--no-proxy")
		dirP50, dirP99 = append(dirP50, p50), append(dirP99, p99)
		p50, p99 = latency(t, agent) // through HTTP_PROXY
		proxyP50, proxyP99 = append(proxyP50, p50), append(proxyP99, p99)
	}
	run.Process.Signal(os.Interrupt)
	run.Wait()

	// Launch: allowlist sandbox against docker run --rm, interleaved.
	lprof := filepath.Join(home, "launch.yaml")
	os.WriteFile(lprof, []byte("image: "+testenv.ProbeImage+"\nnetwork:\n  mode: allowlist\n  allow: [data.test]\n"), 0o644)
	var lp, ld []time.Duration
	for i := range rounds + 2 {
		p := launch(t, ws, launchEnv, launcher, "run", "-p", lprof, "--", "exit", "0")
		d := launch(t, ws, os.Environ(), "docker", "run", "--rm", testenv.ProbeImage, "exit", "0")
		if i >= 2 { // two warm-ups
			lp, ld = append(lp, p), append(ld, d)
		}
	}
	if out, _ := testenv.Docker("ps", "-aq", "--filter", "label=dev.propio-sandbox.workspace="+ws); strings.TrimSpace(out) != "" {
		t.Errorf("containers of the benchmark remain: %s", out)
	}

	mbps := func(sec float64) float64 { return float64(downloadBytes) / sec / 1e6 }
	thr := medianF(directSec) / medianF(viaSec) // throughput ratio via/direct
	added50 := medianF(viaP50) - medianF(dirP50)
	added99 := medianF(viaP99) - medianF(dirP99)
	var b strings.Builder
	fmt.Fprintf(&b, "egress gateway, %d rounds, medians; arms alternate\n", rounds)
	fmt.Fprintf(&b, "throughput, %d MB over HTTP: through the gateway %.0f MB/s (%.0f..%.0f), direct %.0f MB/s (%.0f..%.0f): ratio %.3fx (target >= %.2fx)\n",
		downloadBytes>>20, mbps(medianF(viaSec)), mbps(slices.Max(viaSec)), mbps(slices.Min(viaSec)),
		mbps(medianF(directSec)), mbps(slices.Max(directSec)), mbps(slices.Min(directSec)), thr, ThroughputTarget)
	fmt.Fprintf(&b, "throughput, %d MB from a server paced at 1 Gbit/s: through the gateway %.0f MB/s, direct %.0f MB/s: ratio %.3fx\n",
		downloadBytes>>20, mbps(medianF(viaLink)), mbps(medianF(directLink)), medianF(directLink)/medianF(viaLink))
	fmt.Fprintf(&b, "latency, %d requests on new connections: p50 %.0f us vs %.0f us direct (added %.0f us, target < %.0f us); p99 %.0f us vs %.0f us (added %.0f us); p50 ratio %.2fx\n",
		latencyRequests, medianF(viaP50), medianF(dirP50), added50, float64(LatencyTarget/time.Microsecond), medianF(viaP99), medianF(dirP99), added99, medianF(viaP50)/medianF(dirP50))
	fmt.Fprintf(&b, "latency through the explicit proxy (HTTP_PROXY): p50 %.0f us (added %.0f us), p99 %.0f us (added %.0f us)\n",
		medianF(proxyP50), medianF(proxyP50)-medianF(dirP50), medianF(proxyP99), medianF(proxyP99)-medianF(dirP99))
	fmt.Fprintf(&b, "launch of `exit 0`: allowlist sandbox %.0f ms, docker run --rm %.0f ms: ratio %.3fx",
		ms(median(lp)), ms(median(ld)), float64(median(lp))/float64(median(ld)))
	t.Logf("\n%s", b.String())
	if thr < ThroughputTarget {
		t.Errorf("gateway throughput %.3fx direct, below the target %.2fx", thr, ThroughputTarget)
	}
	if added50 >= float64(LatencyTarget/time.Microsecond) {
		t.Errorf("gateway adds %.0f us at p50, over the target %v", added50, LatencyTarget)
	}
}

func mustDocker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := testenv.Docker(args...)
	if err != nil {
		t.Fatalf("docker %v: %v", args, err)
	}
	return out
}

// waitAgent returns the running agent container of the workspace's sandbox.
func waitAgent(t *testing.T, ws string) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		out, _ := testenv.Docker("ps", "-q", "--filter", "label=dev.propio-sandbox.workspace="+ws, "--filter", "label=com.docker.compose.service=agent", "--filter", "status=running")
		if id := strings.TrimSpace(out); id != "" {
			return id
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the allowlist sandbox did not start in 2 minutes")
	return ""
}

func execProbe(t *testing.T, container string, args ...string) string {
	t.Helper()
	return mustDocker(t, append([]string{"exec", container, "/probe"}, args...)...)
}

// downloadSeconds is the time of one transfer, as the probe measured it
// inside the container (docker exec's own start-up is not counted).
func downloadSeconds(t *testing.T, container, url string) float64 {
	t.Helper()
	f := strings.Fields(execProbe(t, container, "download", "--no-proxy", url))
	if len(f) != 4 || f[1] != strconv.Itoa(downloadBytes) {
		t.Fatalf("download output %q", f)
	}
	sec, err := strconv.ParseFloat(f[3], 64)
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

// latency is the p50 and p99 of one sample, in microseconds; --no-proxy
// among flags makes the client ignore the proxy variables.
func latency(t *testing.T, container string, flags ...string) (p50, p99 float64) {
	t.Helper()
	args := append([]string{"latency", strconv.Itoa(latencyRequests)}, flags...)
	f := strings.Fields(execProbe(t, container, append(args, "http://data.test/x")...))
	if len(f) < 4 {
		t.Fatalf("latency output %q", f)
	}
	p50, _ = strconv.ParseFloat(f[1], 64)
	p99, _ = strconv.ParseFloat(f[3], 64)
	return p50, p99
}

func medianF(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
