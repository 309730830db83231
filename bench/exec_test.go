package bench

// A command in a persistent sandbox (up) against docker exec of the same
// command in the same container: `propio-sandbox exec NAME -- CMD` and
// `docker exec CONTAINER CMD`, interleaved; and 100 short commands of an
// agent that runs each tool call through a shell, through the wrapper
// bin/propio-sandbox-sh against 100 docker exec calls.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// ExecTarget is the highest acceptable ratio of exec's median time to
// docker exec's.
const ExecTarget = 1.2

// persistent is a persistent sandbox the benchmark made, and its container.
type persistent struct {
	arms      *arms
	name      string
	container string
}

// upSandbox starts a persistent sandbox of image in a's workspace (network
// none), removed when the benchmark ends.
func upSandbox(tb testing.TB, a *arms, image string) *persistent {
	tb.Helper()
	profile := filepath.Join(filepath.Dir(a.profile), "up.yaml")
	if err := os.WriteFile(profile, []byte("image: "+image+"\nnetwork: {mode: none}\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	_, out := timed(tb, a.workspace, a.env, a.launcher, "up", "-p", profile)
	name := strings.TrimSpace(strings.SplitN(out, "\n", 2)[0])
	tb.Cleanup(func() { timed(tb, a.workspace, a.env, a.launcher, "down", name) })
	id, err := testenv.Docker("ps", "-q", "--no-trunc", "--filter", "label=dev.propio-sandbox.project=propio-"+name, "--filter", "label=com.docker.compose.service=agent")
	if err != nil || strings.TrimSpace(id) == "" {
		tb.Fatalf("the sandbox's container: %v %q\n%s", err, id, out)
	}
	return &persistent{arms: a, name: name, container: strings.TrimSpace(id)}
}

// TestExecRatio measures PROPIO_BENCH_N (default 30) interleaved runs of
// `exit 0` in the probe, through exec and through docker exec, and fails
// when the ratio of the medians exceeds ExecTarget.
func TestExecRatio(t *testing.T) {
	n := benchRounds(t, "exec benchmark", "about 0.1 s a command, 2*(N+5) commands", 30)
	a := newArms(t)
	p := upSandbox(t, a, testenv.ProbeImage)
	propio := func() time.Duration {
		return launch(t, a.workspace, a.env, a.launcher, "exec", p.name, "--", "/probe", "exit", "0")
	}
	docker := func() time.Duration {
		return launch(t, a.workspace, os.Environ(), "docker", "exec", p.container, "/probe", "exit", "0")
	}
	for range 5 {
		propio()
		docker()
	}
	r := pair{what: "`/probe exit 0` in a running persistent sandbox", a: "propio-sandbox exec", b: "docker exec"}
	for i := range n {
		// Each round in the other order too: neither arm always goes first.
		if i%2 == 0 {
			r.x, r.y = append(r.x, propio()), append(r.y, docker())
		} else {
			r.y, r.x = append(r.y, docker()), append(r.x, propio())
		}
	}
	t.Logf("\n%s", r.report(ExecTarget))
	if ratio := r.ratio(); ratio > ExecTarget {
		t.Errorf("exec takes %.2fx the time of docker exec (median), over the target %.2fx", ratio, ExecTarget)
	}
}

// TestExecWrapper runs 100 short commands (`true`) as an agent that
// sandboxes each tool call runs them: through bin/propio-sandbox-sh -c, in
// the directory's persistent sandbox of the default image, against 100
// `docker exec CONTAINER sh -c true`, interleaved. It reports the totals
// and the ratio of the medians; nothing is asserted.
func TestExecWrapper(t *testing.T) {
	n := benchRounds(t, "per-command benchmark", "about 0.1 s a command, 2*(N+5) commands", 100)
	a := newArms(t)
	if _, err := testenv.Docker("image", "inspect", "propio-sandbox/agent:latest"); err != nil {
		t.Skipf("needs propio-sandbox/agent:latest (its sh): %v", err)
	}
	p := upSandbox(t, a, "propio-sandbox/agent:latest")
	wrapper := filepath.Join(testenv.RepoRoot(), "bin", "propio-sandbox-sh")
	env := append(slices.Clone(a.env), "PROPIO_SANDBOX_BIN="+a.launcher)
	viaWrapper := func() time.Duration { return launch(t, a.workspace, env, wrapper, "-c", "true") }
	docker := func() time.Duration {
		return launch(t, a.workspace, os.Environ(), "docker", "exec", p.container, "sh", "-c", "true")
	}
	for range 5 {
		viaWrapper()
		docker()
	}
	r := pair{what: "`sh -c true` in a running persistent sandbox", a: "propio-sandbox-sh -c", b: "docker exec sh -c"}
	for i := range n {
		if i%2 == 0 {
			r.x, r.y = append(r.x, viaWrapper()), append(r.y, docker())
		} else {
			r.y, r.x = append(r.y, docker()), append(r.x, viaWrapper())
		}
	}
	t.Logf("\n%s\ntotals for %d commands: %s %.2fs, %s %.2fs", r.report(0), n, r.a, sum(r.x).Seconds(), r.b, sum(r.y).Seconds())
}

// pair is two arms' times of the same command.
type pair struct {
	what, a, b string
	x, y       []time.Duration
}

func (p pair) ratio() float64 { return float64(median(p.x)) / float64(median(p.y)) }

// report is a table of both arms and their ratio, against target when it
// is above zero.
func (p pair) report(target float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %d interleaved runs per arm after 5 warm-up runs each\n", p.what, len(p.x))
	fmt.Fprintf(&b, "%-24s %10s %10s %10s %10s\n", "arm", "median", "mean", "min", "max")
	for _, arm := range []struct {
		name string
		d    []time.Duration
	}{{p.a, p.x}, {p.b, p.y}} {
		fmt.Fprintf(&b, "%-24s %8.1fms %8.1fms %8.1fms %8.1fms\n", arm.name, ms(median(arm.d)), ms(mean(arm.d)), ms(slices.Min(arm.d)), ms(slices.Max(arm.d)))
	}
	fmt.Fprintf(&b, "ratio of the medians: %.3fx", p.ratio())
	if target > 0 {
		verdict := "within"
		if p.ratio() > target {
			verdict = "over"
		}
		fmt.Fprintf(&b, " (target %.2fx: %s)", target, verdict)
	}
	fmt.Fprintf(&b, "; of the means: %.3fx", float64(mean(p.x))/float64(mean(p.y)))
	return b.String()
}

func sum(d []time.Duration) time.Duration {
	var s time.Duration
	for _, x := range d {
		s += x
	}
	return s
}
