package diskcap

import (
	"context"
	"sync"
	"time"
)

// Gauge is one thing whose growth is capped: what the sandbox has written
// to some place, measured at some cost.
type Gauge struct {
	// What names the place in messages: "the workspace", "its writable layer".
	What string
	// Size measures what the sandbox has written there so far, in bytes.
	Size func(context.Context) (int64, error)
	// FS, when set, gives paths on the file systems that hold the place:
	// their growth in use (statfs, summed poll by poll) bounds the growth
	// of Size from above (unless something else frees space on them in
	// the same poll), so that Size is measured only when that bound
	// reaches the cap, or at the latest every Quiet. Nil: Size is measured
	// at intervals.
	FS func() []string
}

// Timing of Watch. A measure is never repeated sooner than Duty times what
// the last one cost (so that measuring takes at most 1/Duty of a core).
type Timing struct {
	// Poll is how often the file systems of a gauge with FS are looked at.
	Poll time.Duration
	// Quiet is the longest a gauge with FS goes unmeasured: it catches
	// growth that space freed elsewhere on the same file system hid.
	Quiet time.Duration
	// Min and Max bound the interval of a gauge without FS.
	Min, Max time.Duration
	Duty     int
}

// DefaultTiming suits a machine shared with other work: statfs four times a
// second; a walk at most a twentieth of a core; an engine's size query every
// second at most, every half minute at least.
var DefaultTiming = Timing{Poll: 250 * time.Millisecond, Quiet: 30 * time.Second, Min: time.Second, Max: 30 * time.Second, Duty: 20}

// Over is a gauge that grew past the cap.
type Over struct {
	Gauge *Gauge
	Size  int64 // what it measured
}

// Watch measures the gauges until ctx ends or one of them has grown past
// limit, which it returns (nil when ctx ended first). Errors of a measure
// are passed to errf (when not nil) and the gauge is measured again later.
// It returns only when every goroutine it started has ended.
func Watch(ctx context.Context, limit int64, gauges []*Gauge, t Timing, errf func(*Gauge, error)) *Over {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		once sync.Once
		over *Over
	)
	for _, g := range gauges {
		wg.Go(func() {
			if size, ok := watchOne(ctx, g, limit, t, errf); ok {
				once.Do(func() { over = &Over{Gauge: g, Size: size}; cancel() })
			}
		})
	}
	wg.Wait()
	return over
}

// watchOne watches one gauge; it returns its size and true when the size
// went past limit.
func watchOne(ctx context.Context, g *Gauge, limit int64, t Timing, errf func(*Gauge, error)) (int64, bool) {
	// prev is each file system's use at the last poll; grown sums, since
	// the last measure, the increases from poll to poll: space freed
	// elsewhere can hide growth only within one poll, not across them.
	prev := map[string]int64{}
	var grown int64
	if g.FS != nil {
		prev = used(g.FS(), nil)
	}
	var size int64 // at the last good measure
	var cost time.Duration
	var at time.Time
	measure := func() bool {
		grown = 0 // before the measure: what is written during it counts next time
		start := time.Now()
		s, err := g.Size(ctx)
		cost, at = time.Since(start), time.Now()
		if err != nil {
			if errf != nil && ctx.Err() == nil {
				errf(g, err)
			}
			return false
		}
		size = s
		return size > limit
	}
	if measure() {
		return size, true
	}
	wait := t.Poll
	if g.FS == nil {
		wait = clamp(cost*time.Duration(t.Duty), t.Min, t.Max)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	fresh := false // a file system not seen before: what it holds is not in size yet
	for {
		select {
		case <-ctx.Done():
			return size, false
		case <-timer.C:
		}
		gap := cost * time.Duration(t.Duty)
		if g.FS == nil {
			if measure() {
				return size, true
			}
			timer.Reset(clamp(cost*time.Duration(t.Duty), t.Min, t.Max))
			continue
		}
		paths := g.FS()
		if len(paths) == 0 {
			// Nothing to statfs yet (a container not made yet): measure
			// at intervals until there is.
			if time.Since(at) >= clamp(gap, t.Min, t.Max) && measure() {
				return size, true
			}
			timer.Reset(t.Poll)
			continue
		}
		now := used(paths, prev)
		for p, u := range now {
			if l, ok := prev[p]; ok {
				grown += max(0, u-l)
			} else {
				fresh = true
			}
		}
		prev = now
		since := time.Since(at)
		if (fresh || size+grown > limit) && since >= gap || since >= max(t.Quiet, gap) {
			fresh = false
			if measure() {
				return size, true
			}
		}
		timer.Reset(t.Poll)
	}
}

// used reads statfs of each path; a path it cannot read keeps its previous
// value (or is left out).
func used(paths []string, prev map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(paths))
	for _, p := range paths {
		if u, err := Used(p); err == nil {
			out[p] = u
		} else if v, ok := prev[p]; ok {
			out[p] = v
		}
	}
	return out
}

func clamp(d, lo, hi time.Duration) time.Duration {
	return min(max(d, lo), hi)
}
