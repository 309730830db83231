package gateway

// This file holds the bandwidth cap: one token bucket per direction, shared
// by every connection of a gateway, so the cap is the sandbox's, not each
// connection's.

import (
	"context"
	"io"
	"sync"
	"time"
)

// limiter is a token bucket of bytes. Its clock and sleep are fields so a
// test can run it on a fake clock.
type limiter struct {
	rate  float64 // bytes per second
	burst float64 // the bucket's size: what an idle gateway may send at once
	chunk int     // the most bytes one wait covers (at most burst)
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error

	mu     sync.Mutex
	tokens float64 // may go below zero: bytes already promised to waiters
	last   time.Time
}

// newLimiter is a bucket of bytesPerSecond (which must be positive) holding
// a tenth of a second of traffic, and full.
func newLimiter(bytesPerSecond int64, now func() time.Time, sleep func(context.Context, time.Duration) error) *limiter {
	burst := max(float64(bytesPerSecond)/10, 1)
	l := &limiter{
		rate:  float64(bytesPerSecond),
		burst: burst,
		chunk: int(min(burst, 32<<10)),
		now:   now,
		sleep: sleep,
	}
	l.tokens, l.last = burst, now()
	return l
}

// sleepContext waits d, or until ctx ends.
func sleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait takes n bytes (at most l.chunk) from the bucket, sleeping until the
// bucket has them. Waiters are served in the order they came: each takes its
// bytes at once, leaving the bucket in debt, and sleeps until the debt up to
// its own bytes is paid. If ctx ends first, the bytes go back and wait
// returns ctx's error.
func (l *limiter) wait(ctx context.Context, n int) error {
	l.mu.Lock()
	now := l.now()
	if elapsed := now.Sub(l.last); elapsed > 0 {
		l.tokens = min(l.burst, l.tokens+elapsed.Seconds()*l.rate)
		l.last = now
	}
	l.tokens -= float64(n)
	debt := -l.tokens
	l.mu.Unlock()
	if debt <= 0 {
		return nil
	}
	if err := l.sleep(ctx, time.Duration(debt/l.rate*float64(time.Second))); err != nil {
		l.mu.Lock()
		l.tokens = min(l.burst, l.tokens+float64(n))
		l.mu.Unlock()
		return err
	}
	return nil
}

// limitedWriter writes to w no faster than l allows; ctx ends its waits.
type limitedWriter struct {
	ctx context.Context
	w   io.Writer
	l   *limiter
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		k := min(len(p), w.l.chunk)
		if err := w.l.wait(w.ctx, k); err != nil {
			return n, err
		}
		m, err := w.w.Write(p[:k])
		n += m
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// direction is which way bytes go: up from the sandbox, down to it.
type direction int

const (
	dirUp direction = iota
	dirDown
)

// limiter is one of the gateway's two buckets, made at the first relayed byte
// from c.Bandwidth; nil when there is no cap.
func (c *Config) limiter(dir direction) *limiter {
	c.limitOnce.Do(func() {
		if c.Bandwidth <= 0 {
			return
		}
		c.limits[dirUp] = newLimiter(c.Bandwidth, time.Now, sleepContext)
		c.limits[dirDown] = newLimiter(c.Bandwidth, time.Now, sleepContext)
	})
	return c.limits[dir]
}

// limit returns w, capped for bytes going dir.
func (c *Config) limit(ctx context.Context, w io.Writer, dir direction) io.Writer {
	l := c.limiter(dir)
	if l == nil {
		return w
	}
	return &limitedWriter{ctx: ctx, w: w, l: l}
}
