package bench

// What the disk cap's watch adds to a launch: `propio-sandbox run -- exit 0`
// with a writable root filesystem and an rw workspace (both watched: a walk
// of the workspace for its baseline while the container starts, the
// writable layer's directory found) against the same launch with a
// read-only root filesystem and a read-only workspace (nothing to watch),
// interleaved, in a workspace of PROPIO_BENCH_FILES files (default 20,000).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/diskcap"
	"github.com/propio/propio-sandbox/internal/testenv"
)

func TestDiskWatchLaunch(t *testing.T) {
	if os.Getenv("PROPIO_BENCH") != "1" {
		t.Skip("disk watch benchmark: set PROPIO_BENCH=1 to run it (about a second per launch, 2*(N+3) launches)")
	}
	n := defaultN
	if v := os.Getenv("PROPIO_BENCH_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("PROPIO_BENCH_N=%q: want a positive number", v)
		}
	}
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
	run := func(name string) time.Duration {
		return launch(t, a.workspace, a.env, a.launcher, "run", "-p", paths[name], "--", "exit", "0")
	}
	for range warmup {
		run("watched")
		run("unwatched")
	}
	var watched, unwatched []time.Duration
	for i := range n {
		// Alternate which goes first, so that neither always follows the other.
		if i%2 == 0 {
			watched = append(watched, run("watched"))
			unwatched = append(unwatched, run("unwatched"))
		} else {
			unwatched = append(unwatched, run("unwatched"))
			watched = append(watched, run("watched"))
		}
	}
	a.checkNothingLeft(t)
	t.Logf("\nlaunch of `exit 0` in a workspace of %d files (one walk of it: %.0f ms), %d interleaved runs per arm after %d warm-up runs each\n"+
		"%-46s %10s %10s %10s %10s\n"+
		"%-46s %8.0fms %8.0fms %8.0fms %8.0fms\n"+
		"%-46s %8.0fms %8.0fms %8.0fms %8.0fms\n"+
		"ratio watched/unwatched of the medians: %.3fx, of the means: %.3fx",
		files, ms(walk), n, warmup,
		"arm", "median", "mean", "min", "max",
		"watched (rw workspace, writable root)", ms(median(watched)), ms(mean(watched)), ms(slices.Min(watched)), ms(slices.Max(watched)),
		"unwatched (ro workspace, read-only root)", ms(median(unwatched)), ms(mean(unwatched)), ms(slices.Min(unwatched)), ms(slices.Max(unwatched)),
		float64(median(watched))/float64(median(unwatched)), float64(mean(watched))/float64(mean(unwatched)))
}
