package gateway

// Tests of the bandwidth cap on a fake clock: no test here waits for real
// time. server_test.go checks the cap end to end on loopback.

import (
	"bytes"
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"
)

// fakeClock is a limiter's clock and sleep. A sleep records its duration and,
// if advance is set, moves the clock on by it.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	advance bool
	slept   []time.Duration
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slept = append(f.slept, d)
	if f.advance {
		f.now = f.now.Add(d)
	}
	return nil
}

func (f *fakeClock) Add(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

func (f *fakeClock) sleeps() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.slept...)
}

func newFakeLimiter(bytesPerSecond int64, advance bool) (*limiter, *fakeClock) {
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), advance: advance}
	return newLimiter(bytesPerSecond, clock.Now, clock.Sleep), clock
}

// near reports whether two durations differ by less than a microsecond (the
// bucket counts in floating point).
func near(a, b time.Duration) bool { return math.Abs(float64(a-b)) < float64(time.Microsecond) }

func TestNewLimiterSizes(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		rate         int64
		burst, chunk int
	}{
		"the minimum, 8kbit": {1000, 100, 100},
		"10mbit":             {1_250_000, 125_000, 32 << 10},
		"1 byte a second":    {1, 1, 1},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, _ := newFakeLimiter(tt.rate, false)
			if int(l.burst) != tt.burst || l.chunk != tt.chunk || l.tokens != l.burst {
				t.Errorf("burst %v, chunk %d, tokens %v; want burst %d, chunk %d, and a full bucket", l.burst, l.chunk, l.tokens, tt.burst, tt.chunk)
			}
		})
	}
}

// TestLimiterWait follows one bucket through a sequence of waits at 1000
// bytes a second (a bucket of 100 bytes).
func TestLimiterWait(t *testing.T) {
	t.Parallel()
	l, clock := newFakeLimiter(1000, false)
	ctx := context.Background()
	steps := []struct {
		name  string
		after time.Duration // the clock moves on this much first
		n     int
		sleep time.Duration // 0: none
	}{
		{"a full bucket pays at once", 0, 100, 0},
		{"an empty bucket makes the next wait", 0, 50, 50 * time.Millisecond},
		{"a second waiter waits behind the first", 0, 100, 150 * time.Millisecond},
		{"time pays the debt", 150 * time.Millisecond, 100, 100 * time.Millisecond},
		{"an idle bucket fills up to its size only", time.Hour, 100, 0},
		{"and is empty again", 0, 1, time.Millisecond},
	}
	for _, s := range steps {
		clock.Add(s.after)
		before := len(clock.sleeps())
		if err := l.wait(ctx, s.n); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		slept := clock.sleeps()[before:]
		switch {
		case s.sleep == 0 && len(slept) != 0:
			t.Errorf("%s: slept %v, want no sleep", s.name, slept)
		case s.sleep != 0 && (len(slept) != 1 || !near(slept[0], s.sleep)):
			t.Errorf("%s: slept %v, want %v", s.name, slept, s.sleep)
		}
	}
}

// TestLimiterCancel: a waiter whose context ends gives its bytes back, so
// the next waiter does not wait for them.
func TestLimiterCancel(t *testing.T) {
	t.Parallel()
	l, clock := newFakeLimiter(1000, false)
	if err := l.wait(context.Background(), 100); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.wait(ctx, 100); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with an ended context = %v, want context.Canceled", err)
	}
	if err := l.wait(context.Background(), 100); err != nil {
		t.Fatal(err)
	}
	if slept := clock.sleeps(); len(slept) != 1 || !near(slept[0], 100*time.Millisecond) {
		t.Errorf("slept %v, want 100ms: the cancelled waiter's bytes are not owed", slept)
	}
}

// TestLimitedWriterRate writes through the cap on a clock that sleeps move
// on: every byte gets through, in chunks no bigger than the limiter's, and
// the clock shows the rate.
func TestLimitedWriterRate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		rate      int64
		size      int
		writeSize int
	}{
		{"small writes", 1000, 10_000, 7},
		{"large writes", 1000, 10_000, 4096},
		{"10mbit, one write", 1_250_000, 5_000_000, 5_000_000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, clock := newFakeLimiter(tt.rate, true)
			start := clock.Now()
			var dst chunkRecorder
			w := &limitedWriter{ctx: context.Background(), w: &dst, l: l}
			payload := bytes.Repeat([]byte("x"), tt.size)
			for p := payload; len(p) > 0; {
				k := min(len(p), tt.writeSize)
				if n, err := w.Write(p[:k]); n != k || err != nil {
					t.Fatalf("Write(%d bytes) = %d, %v", k, n, err)
				}
				p = p[k:]
			}
			if !bytes.Equal(dst.buf.Bytes(), payload) {
				t.Fatalf("wrote %d bytes, want the %d of the payload", dst.buf.Len(), len(payload))
			}
			if dst.largest > l.chunk {
				t.Errorf("a write of %d bytes got through, more than a chunk (%d)", dst.largest, l.chunk)
			}
			// The bucket starts full, so the first burst is free.
			want := time.Duration(float64(tt.size-int(l.burst)) / float64(tt.rate) * float64(time.Second))
			if got := clock.Now().Sub(start); math.Abs(float64(got-want)) > float64(time.Millisecond) {
				t.Errorf("%d bytes took %v on the fake clock, want %v", tt.size, got, want)
			}
		})
	}
}

// chunkRecorder keeps what is written and the largest single write.
type chunkRecorder struct {
	buf     bytes.Buffer
	largest int
}

func (c *chunkRecorder) Write(p []byte) (int, error) {
	c.largest = max(c.largest, len(p))
	return c.buf.Write(p)
}

// TestLimitedWriterStops: a write waiting for the cap ends with the
// context, having written what it had paid for.
func TestLimitedWriterStops(t *testing.T) {
	t.Parallel()
	l, _ := newFakeLimiter(1000, false)
	l.sleep = sleepContext // real waits: 100 bytes pay at once, the rest would take seconds
	ctx, cancel := context.WithCancel(context.Background())
	var dst chunkRecorder
	done := make(chan error, 1)
	go func() {
		_, err := (&limitedWriter{ctx: ctx, w: &dst, l: l}).Write(make([]byte, 10_000))
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Write = %v, want context.Canceled", err)
		}
	case <-time.After(ioTimeout):
		t.Fatal("Write went on after its context ended")
	}
	if n := dst.buf.Len(); n > 100 {
		t.Errorf("%d bytes written, more than the free burst of 100", n)
	}
}

func TestSleepContext(t *testing.T) {
	t.Parallel()
	if err := sleepContext(context.Background(), time.Millisecond); err != nil {
		t.Errorf("sleepContext = %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := sleepContext(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(start) > ioTimeout {
		t.Errorf("sleepContext with an ended context = %v after %v, want context.Canceled at once", err, time.Since(start))
	}
}

// TestConfigLimiters: no cap, no limiter (and writers pass through); with a
// cap, one limiter per direction, the same for every connection.
func TestConfigLimiters(t *testing.T) {
	t.Parallel()
	var w bytes.Buffer
	none := &Config{}
	if none.limiter(dirUp) != nil || none.limiter(dirDown) != nil || none.limit(context.Background(), &w, dirUp) != &w {
		t.Error("a Config without Bandwidth limits")
	}
	c := &Config{Bandwidth: 1_250_000}
	up, down := c.limiter(dirUp), c.limiter(dirDown)
	if up == nil || down == nil || up == down {
		t.Fatalf("limiters %p and %p, want two", up, down)
	}
	if c.limiter(dirUp) != up || c.limiter(dirDown) != down {
		t.Error("a second call made new limiters: the cap would be per connection")
	}
	if up.rate != 1_250_000 || down.rate != 1_250_000 {
		t.Errorf("rates %v and %v, want 1250000 each way", up.rate, down.rate)
	}
	if lw, ok := c.limit(context.Background(), &w, dirDown).(*limitedWriter); !ok || lw.l != down {
		t.Error("limit does not go through the down limiter")
	}
}
