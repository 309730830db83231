// Package bench measures what propio-sandbox adds to starting a container:
// `propio-sandbox run -- exit 0` against `docker run --rm IMAGE exit 0`, the
// same image (the e2e probe, FROM scratch) and the same command, on the
// same engine. The target is a launch no more than 1.15 times docker's.
//
// The runs are interleaved (propio, docker, propio, docker, ...) after a
// warm-up, so that a slow moment of the machine falls on both arms alike;
// medians are compared, as one slow run moves a mean a lot.
//
// TestLaunchRatio runs only with PROPIO_BENCH=1, so that `go test ./...`
// stays fast; BenchmarkLaunch runs with -bench. Both need an engine, and
// nothing is pulled: testenv builds the launcher and the probe image here.
package bench

import (
	"bytes"
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

// Target is the highest acceptable ratio of propio-sandbox's median launch
// time to docker run's.
const Target = 1.15

const (
	warmup   = 3  // launches of each arm before measuring
	defaultN = 20 // measured launches of each arm in TestLaunchRatio
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// TestLaunchRatio measures PROPIO_BENCH_N (default 20) interleaved launches
// of each arm and fails when the ratio of the medians exceeds Target.
func TestLaunchRatio(t *testing.T) {
	n := benchRounds(t, "launch benchmark", "about a second per launch, 2*(N+3) launches", defaultN)
	a := newArms(t)
	a.warm(t)
	// Another build of the launcher (one from before a change), interleaved
	// with the other two: the launch is no worse when this ratio is not
	// above 1 beyond the noise.
	base := os.Getenv("PROPIO_BENCH_BASE_LAUNCHER")
	var propio, docker, baseline []time.Duration
	for range n {
		propio = append(propio, a.propio(t))
		docker = append(docker, a.docker(t))
		if base != "" {
			baseline = append(baseline, launch(t, a.workspace, a.env, base, "run", "-p", a.profile, "--", "exit", "0"))
		}
	}
	a.checkNothingLeft(t)
	r := report{propio: propio, docker: docker}
	t.Logf("\n%s", r)
	if base != "" {
		t.Logf("PROPIO_BENCH_BASE_LAUNCHER %s: median %.0fms, %.3fx docker run; this launcher / it: medians %.3fx, means %.3fx",
			base, ms(median(baseline)), float64(median(baseline))/float64(median(docker)),
			float64(median(propio))/float64(median(baseline)), float64(mean(propio))/float64(mean(baseline)))
	}
	if ratio := r.ratio(); ratio > Target {
		t.Errorf("propio-sandbox launches in %.2fx the time of docker run (median), over the target %.2fx", ratio, Target)
	}
}

// BenchmarkLaunch launches both arms once per iteration, interleaved, and
// reports each arm's median and the ratio of the medians; ns/op is the time
// of one pair. Use -benchtime 20x: the default 1s allows a single pair.
func BenchmarkLaunch(b *testing.B) {
	a := newArms(b)
	a.warm(b)
	var propio, docker []time.Duration
	b.ResetTimer()
	for range b.N {
		propio = append(propio, a.propio(b))
		docker = append(docker, a.docker(b))
	}
	b.StopTimer()
	a.checkNothingLeft(b)
	r := report{propio: propio, docker: docker}
	b.ReportMetric(ms(median(propio)), "propio-ms")
	b.ReportMetric(ms(median(docker)), "docker-ms")
	b.ReportMetric(r.ratio(), "ratio")
	b.Logf("\n%s", r)
}

// arms holds what both arms run.
type arms struct {
	launcher  string
	workspace string
	profile   string
	env       []string // the launcher's: a home of its own, nothing of the user's
}

func newArms(tb testing.TB) *arms {
	tb.Helper()
	launcher := testenv.RequireEngine(tb)
	base := tb.TempDir()
	if real, err := filepath.EvalSymlinks(base); err == nil {
		base = real
	}
	a := &arms{launcher: launcher, workspace: filepath.Join(base, "workspace")}
	home := filepath.Join(base, "home")
	for _, d := range []string{a.workspace, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	a.profile = filepath.Join(home, "bench.yaml")
	profile := "image: " + testenv.ProbeImage + "\nnetwork: {mode: open}\n"
	if err := os.WriteFile(a.profile, []byte(profile), 0o644); err != nil {
		tb.Fatal(err)
	}
	a.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"XDG_STATE_HOME=" + filepath.Join(home, ".local", "state"),
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		a.env = append(a.env, "DOCKER_HOST="+h)
	}
	return a
}

func (a *arms) warm(tb testing.TB) {
	tb.Helper()
	for range warmup {
		a.propio(tb)
		a.docker(tb)
	}
}

// propio times `propio-sandbox run -p PROFILE -- exit 0` in the workspace.
func (a *arms) propio(tb testing.TB) time.Duration {
	tb.Helper()
	return launch(tb, a.workspace, a.env, a.launcher, "run", "-p", a.profile, "--", "exit", "0")
}

// docker times `docker run --rm IMAGE exit 0`.
func (a *arms) docker(tb testing.TB) time.Duration {
	tb.Helper()
	return launch(tb, a.workspace, os.Environ(), "docker", "run", "--rm", testenv.ProbeImage, "exit", "0")
}

// launch runs one command to its end and returns how long it took, from
// just before the process starts until it has exited.
func launch(tb testing.TB, dir string, env []string, name string, args ...string) time.Duration {
	tb.Helper()
	took, _ := timed(tb, dir, env, name, args...)
	return took
}

// timed runs a command to its end (a minute at most) and returns how long
// it took and its output.
func timed(tb testing.TB, dir string, env []string, name string, args ...string) (time.Duration, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return took, out.String()
}

// checkNothingLeft fails when a container of the benchmark's workspace
// remains: each measured launch must include its whole teardown.
func (a *arms) checkNothingLeft(tb testing.TB) {
	tb.Helper()
	out, err := testenv.Docker("ps", "-aq", "--filter", "label=dev.propio-sandbox.workspace="+a.workspace)
	if err != nil {
		tb.Fatalf("listing leftovers: %v", err)
	}
	if strings.TrimSpace(out) != "" {
		tb.Errorf("containers of the benchmark remain: %s", strings.Fields(out))
	}
}

// report is the measured launch times of both arms.
type report struct {
	propio, docker []time.Duration
}

func (r report) ratio() float64 {
	return float64(median(r.propio)) / float64(median(r.docker))
}

func (r report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "launch of `exit 0` in %s, %d interleaved runs per arm after %d warm-up runs each\n", testenv.ProbeImage, len(r.propio), warmup)
	fmt.Fprintf(&b, "%-34s %10s %10s %10s %10s\n", "arm", "median", "mean", "min", "max")
	for _, arm := range []struct {
		name string
		d    []time.Duration
	}{
		{"propio-sandbox run (network open)", r.propio},
		{"docker run --rm", r.docker},
	} {
		fmt.Fprintf(&b, "%-34s %8.0fms %8.0fms %8.0fms %8.0fms\n", arm.name, ms(median(arm.d)), ms(mean(arm.d)), ms(slices.Min(arm.d)), ms(slices.Max(arm.d)))
	}
	verdict := "within"
	if r.ratio() > Target {
		verdict = "over"
	}
	fmt.Fprintf(&b, "ratio propio/docker of the medians: %.3fx (target %.2fx: %s)\n", r.ratio(), Target, verdict)
	fmt.Fprintf(&b, "ratio of the means: %.3fx", float64(mean(r.propio))/float64(mean(r.docker)))
	return b.String()
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mean(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchRounds skips t, saying what it is and what it costs, unless
// PROPIO_BENCH=1; then it returns PROPIO_BENCH_N, or def when unset.
func benchRounds(t *testing.T, what, cost string, def int) int {
	t.Helper()
	if os.Getenv("PROPIO_BENCH") != "1" {
		t.Skipf("%s: set PROPIO_BENCH=1 to run it (%s)", what, cost)
	}
	v := os.Getenv("PROPIO_BENCH_N")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("PROPIO_BENCH_N=%q: want a positive number", v)
	}
	return n
}
