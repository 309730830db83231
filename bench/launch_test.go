// Package bench measures what propio-sandbox adds to starting a container:
// `propio-sandbox run -- clock` against `docker run --rm IMAGE clock`, the
// same image (the e2e probe, FROM scratch) and the same command (it prints
// the wall clock and exits 0), on the same engine, with the sandbox's
// network open, and with an allowlist: warm (a gateway prepared ahead is
// adopted) and cold (nothing prepared ahead), and warm with a secret
// brokered (as the built-ins strict and standard broker the provider
// keys: the prepared gateway made its CA, the run hands it the value and
// writes the sandbox's trust files). Targets: open at most 1.10
// times docker's, an allowlist (warm, both) at most 1.5 times, both for the time
// until the command runs and the time until the launcher has exited.
//
// The arms run interleaved (each round in another order) after a warm-up,
// so that a slow moment of the machine falls on all alike, and each launch
// starts only once the background work of the one before it (removal,
// preparing ahead) is done, so that it slows no other arm; medians are
// compared, as one slow run moves a mean a lot.
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

	"github.com/propio/propio-sandbox/internal/hostinfo"
	launchpkg "github.com/propio/propio-sandbox/internal/sandbox"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// Targets: the highest acceptable ratio of an arm's median to docker
// run's, for the time until the command runs and until the launcher has
// exited.
const (
	Target          = 1.10 // network open
	TargetAllowlist = 1.5  // an allowlist, warm
)

const (
	warmup   = 3  // launches of each arm before measuring
	defaultN = 20 // measured launches of each arm in TestLaunchRatio
	// backgroundLimit bounds the wait for a launch's background work.
	backgroundLimit = 2 * time.Minute
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// TestLaunchRatio measures PROPIO_BENCH_N (default 20) interleaved launches
// of each arm and fails when an arm with a target is over it.
func TestLaunchRatio(t *testing.T) {
	n := benchRounds(t, "launch benchmark", "about a second per launch, 4*(N+3) launches", defaultN)
	a := newArms(t)
	arms := a.launchArms()
	// Another build of the launcher (one from before a change), interleaved
	// with the others: the launch is no worse when its ratio to it is not
	// above 1 beyond the noise.
	if base := os.Getenv("PROPIO_BENCH_BASE_LAUNCHER"); base != "" {
		arms = append(arms, &launchArm{name: "PROPIO_BENCH_BASE_LAUNCHER, open", cmd: a.propioCmd(base, a.profile, nil), workspace: a.workspace})
	}
	for round := range warmup + n {
		k := round % len(arms) // each round starts with another arm
		for _, arm := range append(slices.Clone(arms[k:]), arms[:k]...) {
			arm.measure(t, a, round >= warmup)
		}
	}
	a.checkNothingLeft(t)
	r := report{arms: arms}
	t.Logf("\n%s", r)
	for _, arm := range arms {
		if arm.target == 0 {
			continue
		}
		for _, m := range []struct {
			what string
			d    []time.Duration
			base []time.Duration
		}{{"until the command ran", arm.running, arms[0].running}, {"until the launcher exited", arm.exit, arms[0].exit}} {
			if ratio := float64(median(m.d)) / float64(median(m.base)); ratio > arm.target {
				t.Errorf("%s: %.2fx docker run's time %s (median), over the target %.2fx", arm.name, ratio, m.what, arm.target)
			}
		}
	}
	for _, warm := range arms {
		if warm.warm && warm.adopted < len(warm.exit) {
			t.Errorf("%s: %d of %d measured launches adopted a gateway prepared ahead", warm.name, warm.adopted, len(warm.exit))
		}
	}
}

// BenchmarkLaunch launches each arm once per iteration, interleaved, and
// reports each arm's medians and ratios; ns/op is the time of one round.
// Use -benchtime 20x: the default 1s allows a single round.
func BenchmarkLaunch(b *testing.B) {
	a := newArms(b)
	arms := a.launchArms()
	for range warmup {
		for _, arm := range arms {
			arm.measure(b, a, false)
		}
	}
	b.ResetTimer()
	for range b.N {
		for _, arm := range arms {
			arm.measure(b, a, true)
		}
	}
	b.StopTimer()
	a.checkNothingLeft(b)
	for _, arm := range arms[1:] {
		key := strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "").Replace(arm.name)
		b.ReportMetric(float64(median(arm.exit))/float64(median(arms[0].exit)), key+"-exit-ratio")
		b.ReportMetric(float64(median(arm.running))/float64(median(arms[0].running)), key+"-running-ratio")
	}
	b.ReportMetric(ms(median(arms[0].exit)), "docker-exit-ms")
	b.Logf("\n%s", report{arms: arms})
}

// arms holds what the arms run: a workspace of their own for each of
// propio-sandbox's arms (so that each one's background work is its own),
// and one home.
type arms struct {
	launcher  string
	workspace string // the open arm's
	profile   string // network open
	allowlist string // network allowlist (allowed.test: nothing is reached)
	secret    string // the allowlist with a secret brokered to llm.test, as strict and standard have
	base      string
	home      string
	env       []string // the launcher's: a home of its own, nothing of the user's
	dirs      hostinfo.Dirs
}

func newArms(tb testing.TB) *arms {
	tb.Helper()
	launcher := testenv.RequireEngine(tb)
	base := tb.TempDir()
	if real, err := filepath.EvalSymlinks(base); err == nil {
		base = real
	}
	a := &arms{launcher: launcher, base: base, workspace: filepath.Join(base, "workspace"), home: filepath.Join(base, "home")}
	for _, d := range []string{a.workspace, a.home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	a.profile = a.writeProfile(tb, "bench.yaml", "network: {mode: open}\n")
	a.allowlist = a.writeProfile(tb, "allowlist.yaml", "network:\n  mode: allowlist\n  allow: [allowed.test]\n")
	a.secret = a.writeProfile(tb, "secret.yaml", "network:\n  mode: allowlist\n  allow: [allowed.test, llm.test]\n"+
		"secrets:\n  LLM_TOKEN: {from: {env: BENCH_LLM_TOKEN}, hosts: [llm.test]}\n")
	a.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + a.home,
		"XDG_CONFIG_HOME=" + filepath.Join(a.home, ".config"),
		"XDG_STATE_HOME=" + filepath.Join(a.home, ".local", "state"),
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		a.env = append(a.env, "DOCKER_HOST="+h)
	}
	a.dirs = hostinfo.Dirs{State: filepath.Join(a.home, ".local", "state", "propio-sandbox")}
	tb.Cleanup(func() { a.discardPrepared(tb) })
	return a
}

func (a *arms) writeProfile(tb testing.TB, name, network string) string {
	tb.Helper()
	path := filepath.Join(a.home, name)
	if err := os.WriteFile(path, []byte("image: "+testenv.ProbeImage+"\n"+network), 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}

// launchArms are docker run, and propio-sandbox with the network open and
// with an allowlist, warm and cold, each cold one in a workspace of its
// own.
func (a *arms) launchArms() []*launchArm {
	warm, cold, secret := filepath.Join(a.base, "allowlist-warm"), filepath.Join(a.base, "allowlist-cold"), filepath.Join(a.base, "secret-warm")
	for _, d := range []string{warm, cold, secret} {
		os.MkdirAll(d, 0o755)
	}
	return []*launchArm{
		{name: "docker run --rm", cmd: func() *exec.Cmd {
			return exec.Command("docker", "run", "--rm", testenv.ProbeImage, "clock")
		}},
		{name: "propio-sandbox, network open", cmd: a.propioCmd(a.launcher, a.profile, nil), workspace: a.workspace, target: Target},
		{name: "propio-sandbox, allowlist (warm)", cmd: a.propioCmd(a.launcher, a.allowlist, nil), workspace: warm, target: TargetAllowlist, warm: true},
		{name: "propio-sandbox, allowlist (cold)", cmd: a.propioCmd(a.launcher, a.allowlist, []string{launchpkg.EnvPrepare + "=0"}), workspace: cold},
		{name: "propio-sandbox, allowlist with a brokered secret (warm)", cmd: a.propioCmd(a.launcher, a.secret, []string{"BENCH_LLM_TOKEN=sk-bench-value"}),
			workspace: secret, target: TargetAllowlist, warm: true},
	}
}

// propioCmd makes `LAUNCHER run -p PROFILE -- clock`, with env added.
func (a *arms) propioCmd(launcher, profile string, env []string) func() *exec.Cmd {
	return func() *exec.Cmd {
		cmd := exec.Command(launcher, "run", "-p", profile, "--", "clock")
		cmd.Env = append(slices.Clone(a.env), env...)
		return cmd
	}
}

// launchArm is one way of launching the probe's clock, and what it measured.
type launchArm struct {
	name      string
	cmd       func() *exec.Cmd
	workspace string  // propio-sandbox's: where it runs, whose background work is waited for
	target    float64 // the highest acceptable ratio to docker run's; 0 for none
	warm      bool    // it adopts a gateway prepared ahead

	running    []time.Duration // from the start until the command ran (its clock)
	exit       []time.Duration // from the start until the launcher exited
	background []time.Duration // from its exit until its background work was done
	adopted    int             // measured launches that adopted a prepared gateway
}

// measure launches the arm once (in its workspace), records its times
// when keep, and waits until its background work is done.
func (r *launchArm) measure(tb testing.TB, a *arms, keep bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := r.cmd()
	cmd.Dir = cmp(r.workspace, a.workspace)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	exit := time.Since(start)
	if err != nil {
		tb.Fatalf("%s: %v\n%s", r.name, err, out.String())
	}
	clock := clockOf(tb, r.name, out.String())
	var bg time.Duration
	if r.workspace != "" {
		t0 := time.Now()
		wctx, wcancel := context.WithTimeout(ctx, backgroundLimit)
		err := launchpkg.WaitBackground(wctx, a.dirs, r.workspace)
		wcancel()
		if err != nil {
			tb.Fatalf("%s: %v", r.name, err)
		}
		bg = time.Since(t0)
	}
	if !keep {
		return
	}
	r.running = append(r.running, clock.Sub(start))
	r.exit = append(r.exit, exit)
	r.background = append(r.background, bg)
	if r.warm && a.adoptedBy(cmd.Process.Pid) {
		r.adopted++
	}
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// clockOf is the time the probe printed.
func clockOf(tb testing.TB, arm, out string) time.Time {
	tb.Helper()
	for _, line := range strings.Split(out, "\n") {
		if ns, ok := strings.CutPrefix(strings.TrimSpace(line), "clock "); ok {
			n, err := strconv.ParseInt(ns, 10, 64)
			if err == nil {
				return time.Unix(0, n)
			}
		}
	}
	tb.Fatalf("%s: the probe printed no clock:\n%s", arm, out)
	return time.Time{}
}

// adoptedBy reports whether the launcher pid adopted a gateway prepared
// ahead, as its keeper wrote in the background log.
func (a *arms) adoptedBy(pid int) bool {
	b, _ := os.ReadFile(filepath.Join(a.dirs.State, "background", "log"))
	return strings.Contains(string(b), "adopted by launcher "+strconv.Itoa(pid)+"\n")
}

// discardPrepared removes the gateway the warm arm left prepared.
func (a *arms) discardPrepared(tb testing.TB) {
	cmd := exec.Command(a.launcher, "gc", "--prepared")
	cmd.Env, cmd.Dir = a.env, a.workspace
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Errorf("gc --prepared: %v\n%s", err, out)
	}
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

// checkNothingLeft fails when a container, network or volume of the
// benchmark's workspaces remains once their background work is done (but
// the warm arm's gateway prepared ahead, removed when the benchmark ends).
func (a *arms) checkNothingLeft(tb testing.TB) {
	tb.Helper()
	ents, _ := os.ReadDir(a.base)
	for _, e := range ents {
		ws := filepath.Join(a.base, e.Name())
		if e.Name() == "home" || !e.IsDir() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), backgroundLimit)
		err := launchpkg.WaitBackground(ctx, a.dirs, ws)
		cancel()
		if err != nil {
			tb.Errorf("%v", err)
		}
		filter := "label=dev.propio-sandbox.workspace=" + ws
		for _, kind := range [][]string{{"ps", "-aq", "--filter", filter, "--filter", "label=dev.propio-sandbox.prepared!=true"}, {"volume", "ls", "-q", "--filter", filter}} {
			out, err := testenv.Docker(kind...)
			if err != nil {
				tb.Fatalf("listing leftovers: %v", err)
			}
			if strings.TrimSpace(out) != "" {
				tb.Errorf("%s of the benchmark remain in %s: %s", kind[0], ws, strings.Fields(out))
			}
		}
	}
}

// report is the measured launch times of the arms, docker run's first.
type report struct {
	arms []*launchArm
}

func (r report) String() string {
	var b strings.Builder
	docker := r.arms[0]
	fmt.Fprintf(&b, "launch of `clock` (prints the wall clock, exits 0) in %s, %d interleaved runs per arm after %d warm-up runs each; medians\n", testenv.ProbeImage, len(docker.exit), warmup)
	fmt.Fprintf(&b, "%-40s %12s %8s %12s %8s %12s\n", "arm", "cmd running", "ratio", "launcher exit", "ratio", "background")
	for _, arm := range r.arms {
		bg := "-"
		if arm.workspace != "" {
			bg = fmt.Sprintf("+%.0fms", ms(median(arm.background)))
		}
		fmt.Fprintf(&b, "%-40s %10.0fms %7.3fx %12.0fms %7.3fx %12s", arm.name,
			ms(median(arm.running)), float64(median(arm.running))/float64(median(docker.running)),
			ms(median(arm.exit)), float64(median(arm.exit))/float64(median(docker.exit)), bg)
		if arm.target > 0 {
			verdict := "within"
			if float64(median(arm.running))/float64(median(docker.running)) > arm.target || float64(median(arm.exit))/float64(median(docker.exit)) > arm.target {
				verdict = "over"
			}
			fmt.Fprintf(&b, "  (target %.2fx: %s)", arm.target, verdict)
		}
		if arm.warm {
			fmt.Fprintf(&b, "  (%d/%d adopted a prepared gateway)", arm.adopted, len(arm.exit))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "background: from the launcher's exit until its background work (removal, preparing the next gateway) was done")
	return b.String()
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
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
