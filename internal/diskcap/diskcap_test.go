package diskcap

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fill writes n bytes of ones (not zeros, which a file system could keep
// sparse) to path.
func fill(t *testing.T, path string, n int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Repeat("1", n)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWalkCountsBlocksOncePerInodeAndNeverFollowsLinks(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	fill(t, filepath.Join(outside, "big"), 4<<20)
	empty, err := Walk(context.Background(), []string{dir})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, filepath.Join(dir, "a"), 1<<20)
	for _, name := range []string{"b", "c"} { // two more names of a: no more blocks
		if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(outside, "big"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	u, err := Walk(context.Background(), []string{dir, filepath.Join(dir, "a")}) // a root inside another counts once
	if err != nil {
		t.Fatal(err)
	}
	grown := u.Bytes - empty.Bytes
	if grown < 1<<20 || grown > 1<<20+64<<10 {
		t.Errorf("a 1 MiB file with three names and two links out grew the tree by %d bytes, want 1 MiB and a little", grown)
	}
	if len(u.FS) != 1 || len(u.Unreadable) != 0 {
		t.Errorf("file systems %v, unreadable %v", u.FS, u.Unreadable)
	}
	if missing, err := Walk(context.Background(), []string{filepath.Join(dir, "nothing")}); err != nil || missing.Bytes != 0 {
		t.Errorf("a missing root: %+v, %v", missing, err)
	}
}

func TestDisjoint(t *testing.T) {
	got := Disjoint([]string{"/a/b", "/a", "/c", "/c/", "/ab"})
	if want := []string{"/a", "/c", "/ab"}; !slices.Equal(got, want) {
		t.Errorf("Disjoint = %q, want %q", got, want)
	}
}

// A file deleted while open still holds its blocks: Held finds it through
// /proc, on the file systems asked about only.
func TestHeldFindsDeletedOpenFiles(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "held"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte(strings.Repeat("1", 2<<20))); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	os.Remove(f.Name())
	dev, err := Dev(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := Held([]int{os.Getpid()}, map[uint64]bool{dev: true})[dev]; got < 2<<20 {
		t.Errorf("held %d bytes on the test's file system, want 2 MiB or more", got)
	}
	if got := Held([]int{os.Getpid()}, map[uint64]bool{dev + 1: true}); len(got) != 0 {
		t.Errorf("held on another file system: %v", got)
	}
}

var fast = Timing{Poll: 10 * time.Millisecond, Quiet: 200 * time.Millisecond, Min: 10 * time.Millisecond, Max: 50 * time.Millisecond, Duty: 20}

// Trees counts what was written since the first measure, and what is held
// deleted; Watch stops at the first measure past the cap, found through the
// statfs trigger well before the quiet interval.
func TestWatchTreesOverCap(t *testing.T) {
	dir := t.TempDir()
	fill(t, filepath.Join(dir, "before"), 8<<20) // the baseline: not the sandbox's
	trees := &Trees{Roots: Static(dir)}
	g := &Gauge{What: "the workspace", Size: trees.Size, FS: trees.FS}
	timing := fast
	timing.Quiet = time.Hour // only the trigger can start a walk
	done := make(chan *Over)
	go func() { done <- Watch(context.Background(), 3<<20, []*Gauge{g}, timing, nil) }()
	time.Sleep(100 * time.Millisecond)
	fill(t, filepath.Join(dir, "small"), 1<<20)
	select {
	case o := <-done:
		t.Fatalf("stopped under the cap: %+v", o)
	case <-time.After(200 * time.Millisecond):
	}
	fill(t, filepath.Join(dir, "big"), 3<<20)
	select {
	case o := <-done:
		if o == nil || o.Gauge != g || o.Size <= 3<<20 || o.Size > 5<<20 {
			t.Fatalf("over = %+v, want the gauge past 3 MiB, at 4 MiB at most", o)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not see 4 MiB written past a 3 MiB cap")
	}
}

// Without a trigger, a gauge is measured at intervals; an error is passed
// on and the gauge measured again; when the context ends, Watch returns nil
// and leaves no goroutine behind.
func TestWatchIntervalsErrorsAndCancel(t *testing.T) {
	var calls atomic.Int64
	g := &Gauge{What: "its writable layer", Size: func(context.Context) (int64, error) {
		n := calls.Add(1)
		if n == 2 {
			return 0, errors.New("engine busy")
		}
		return n, nil
	}}
	var errs atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	before := runtime.NumGoroutine()
	o := Watch(ctx, 1<<30, []*Gauge{g}, fast, func(*Gauge, error) { errs.Add(1) })
	if o != nil {
		t.Fatalf("over = %+v under the cap", o)
	}
	if calls.Load() < 3 || errs.Load() != 1 {
		t.Errorf("%d measures, %d errors; want several measures and the one error", calls.Load(), errs.Load())
	}
	time.Sleep(20 * time.Millisecond)
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("%d goroutines after Watch, %d before", after, before)
	}

	calls.Store(0)
	g.Size = func(context.Context) (int64, error) { return calls.Add(1) * 100, nil }
	o = Watch(context.Background(), 250, []*Gauge{g, {What: "other", Size: func(context.Context) (int64, error) { return 0, nil }}}, fast, nil)
	if o == nil || o.Gauge != g || o.Size != 300 {
		t.Errorf("over = %+v, want the first gauge at 300", o)
	}
}

// A file system's growth that a walk does not confirm (written by someone
// else) starts a walk, not a stop; the next walk waits Duty times the cost.
func TestWatchTriggerIsOnlyAHint(t *testing.T) {
	watched, other := t.TempDir(), t.TempDir()
	var walks atomic.Int64
	trees := &Trees{Roots: Static(watched)}
	g := &Gauge{What: "the workspace", Size: func(ctx context.Context) (int64, error) {
		walks.Add(1)
		return trees.Size(ctx)
	}, FS: trees.FS}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	timing := fast
	timing.Quiet = time.Hour
	go func() {
		time.Sleep(50 * time.Millisecond)
		fill(t, filepath.Join(other, "not-the-sandbox"), 2<<20) // same file system, outside the tree
	}()
	if o := Watch(ctx, 1<<20, []*Gauge{g}, timing, nil); o != nil {
		t.Fatalf("stopped for what was written outside the tree: %+v", o)
	}
	if n := walks.Load(); n < 2 || n > 25 {
		t.Errorf("%d walks, want the first and a few after the trigger", n)
	}
}

// A directory the sandbox fills and then makes unreadable hides its content
// from the walk: the file system's growth since the first measure counts
// instead. (Root reads any directory, so this needs another user.)
func TestTreesUnreadableCountsTheFileSystem(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads every directory; run as another user to see a directory the walk cannot read")
	}
	dir := t.TempDir()
	locked := filepath.Join(dir, "locked")
	if err := os.Mkdir(locked, 0o755); err != nil {
		t.Fatal(err)
	}
	trees := &Trees{Roots: Static(dir)}
	if s, err := trees.Size(context.Background()); err != nil || s != 0 {
		t.Fatalf("baseline: %d, %v", s, err)
	}
	fill(t, filepath.Join(locked, "hidden"), 4<<20)
	if err := os.Chmod(locked, 0); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(locked, 0o755)
	if s, err := trees.Size(context.Background()); err != nil || s < 4<<20 {
		t.Errorf("after 4 MiB written into a directory made unreadable: %d, %v", s, err)
	}
}

// A gauge whose file systems are not known yet (its container is not made)
// is measured at intervals until they are, not left for the quiet one.
func TestWatchGaugeWithoutFileSystemsYet(t *testing.T) {
	var calls atomic.Int64
	g := &Gauge{What: "its writable layer",
		Size: func(context.Context) (int64, error) { return calls.Add(1) * 100, nil },
		FS:   func() []string { return nil }}
	timing := fast
	timing.Quiet = time.Hour
	done := make(chan *Over, 1)
	go func() { done <- Watch(context.Background(), 250, []*Gauge{g}, timing, nil) }()
	select {
	case o := <-done:
		if o == nil || o.Size != 300 {
			t.Errorf("over = %+v, want the third measure", o)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a gauge without file systems was not measured again")
	}
}

// A walk stops when its context ends (the sandbox has ended: the launcher
// does not wait for a walk of a large tree).
func TestWalkStopsWithItsContext(t *testing.T) {
	dir := t.TempDir()
	fill(t, filepath.Join(dir, "f"), 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Walk(ctx, []string{dir}); !errors.Is(err, context.Canceled) {
		t.Errorf("a walk with an ended context: %v, want context.Canceled", err)
	}
}
