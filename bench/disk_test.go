package bench

// What the disk cap's watch adds to a launch: `propio-sandbox run -- exit 0`
// with a writable root filesystem and an rw workspace (both watched: a walk
// of the workspace for its baseline while the container starts, the
// writable layer's directory found) against the same launch with a
// read-only root filesystem and a read-only workspace (nothing to watch),
// interleaved, in a workspace of PROPIO_BENCH_FILES files (default 20,000).
// PROPIO_BENCH_BASE_LAUNCHER names another build of the launcher (one from
// before the watch) to run the watched profile too: the two then differ by
// the watch alone.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/diskcap"
	"github.com/propio/propio-sandbox/internal/testenv"
)

func TestDiskWatchLaunch(t *testing.T) {
	n := benchRounds(t, "disk watch benchmark", "about a second per launch, 2*(N+3) launches", defaultN)
	files := 20000
	if v := os.Getenv("PROPIO_BENCH_FILES"); v != "" {
		var err error
		if files, err = strconv.Atoi(v); err != nil || files < 0 {
			t.Fatalf("PROPIO_BENCH_FILES=%q: want a number", v)
		}
	}
	a := newArms(t)
	for i := range files {
		dir := filepath.Join(a.workspace, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.txt", i)), []byte("line 1\nline 2\nline 3\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if _, err := diskcap.Walk(context.Background(), []string{a.workspace}); err != nil {
		t.Fatal(err)
	}
	walk := time.Since(start)

	profiles := map[string]string{
		"watched":   "image: " + testenv.ProbeImage + "\nnetwork: {mode: open}\n",
		"unwatched": "image: " + testenv.ProbeImage + "\nnetwork: {mode: open}\nworkspace: {mode: ro}\nsecurity: {read_only_rootfs: true}\n",
	}
	paths := map[string]string{}
	for name, content := range profiles {
		paths[name] = filepath.Join(filepath.Dir(a.profile), name+".yaml")
		if err := os.WriteFile(paths[name], []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	arms := []struct{ name, launcher, profile string }{
		{"watched (rw workspace, writable root)", a.launcher, paths["watched"]},
		{"unwatched (ro workspace, read-only root)", a.launcher, paths["unwatched"]},
	}
	// Another build of the launcher (one from before the watch), on the
	// watched profile: the cleanest comparison, when there is one.
	if base := os.Getenv("PROPIO_BENCH_BASE_LAUNCHER"); base != "" {
		arms = append(arms, struct{ name, launcher, profile string }{"watched, by PROPIO_BENCH_BASE_LAUNCHER", base, paths["watched"]})
	}
	run := func(i int) time.Duration {
		return launch(t, a.workspace, a.env, arms[i].launcher, "run", "-p", arms[i].profile, "--", "exit", "0")
	}
	for range warmup {
		for i := range arms {
			run(i)
		}
	}
	times := make([][]time.Duration, len(arms))
	for round := range n {
		// Each round in another order, so that no arm always follows another.
		for k := range arms {
			i := (k + round) % len(arms)
			times[i] = append(times[i], run(i))
		}
	}
	a.checkNothingLeft(t)
	var b strings.Builder
	fmt.Fprintf(&b, "launch of `exit 0` in a workspace of %d files (one walk of it: %.0f ms), %d interleaved runs per arm after %d warm-up runs each\n", files, ms(walk), n, warmup)
	fmt.Fprintf(&b, "%-46s %10s %10s %10s %10s\n", "arm", "median", "mean", "min", "max")
	for i, arm := range arms {
		d := times[i]
		fmt.Fprintf(&b, "%-46s %8.0fms %8.0fms %8.0fms %8.0fms\n", arm.name, ms(median(d)), ms(mean(d)), ms(slices.Min(d)), ms(slices.Max(d)))
	}
	for i := 1; i < len(arms); i++ {
		fmt.Fprintf(&b, "ratio watched / %s: medians %.3fx, means %.3fx\n", arms[i].name, float64(median(times[0]))/float64(median(times[i])), float64(mean(times[0]))/float64(mean(times[i])))
	}
	t.Logf("\n%s", b.String())
}
