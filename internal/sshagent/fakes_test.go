package sshagent

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// fakeRunner records every command and plays a script. Lines are the
// command and its arguments joined by spaces; a started command is logged as
// "start ...", a kill as "kill", engine questions as "engine: ...".
type fakeRunner struct {
	list      string // podman system connection list output
	listErr   error
	staleErr  error                                  // the rm before the tunnel
	startErr  error                                  // starting the tunnel
	exitEarly error                                  // non-nil: the tunnel exits at once with it
	probes    []bool                                 // `test -S` results in order; false after the last
	probeHook func(ctx context.Context, n int) error // replaces probes when set
	rmErr     error                                  // the rm in Cleanup
	rmHang    bool                                   // the rm in Cleanup blocks until its ctx is done
	killErr   error

	mu      sync.Mutex
	log     []string
	proc    *fakeProc
	nprobe  int
	started bool
}

func (r *fakeRunner) record(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, line)
}

func (r *fakeRunner) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

func (r *fakeRunner) count(prefix string) int {
	n := 0
	for _, l := range r.lines() {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

func (r *fakeRunner) Output(ctx context.Context, name string, args ...string) ([]byte, error) {
	line := strings.Join(append([]string{name}, args...), " ")
	r.record(line)
	switch {
	case name == "podman":
		return []byte(r.list), r.listErr
	case strings.HasSuffix(line, " test -S "+VMSocket("t1")):
		r.mu.Lock()
		n := r.nprobe
		r.nprobe++
		r.mu.Unlock()
		if r.probeHook != nil {
			return nil, r.probeHook(ctx, n)
		}
		if n < len(r.probes) && r.probes[n] {
			return nil, nil
		}
		return nil, errors.New("ssh: exit status 1")
	case strings.HasSuffix(line, " rm -f "+VMSocket("t1")):
		r.mu.Lock()
		started := r.started
		r.mu.Unlock()
		if !started {
			return nil, r.staleErr
		}
		if r.rmHang {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return nil, r.rmErr
	}
	return nil, errors.New("fake runner: unexpected command " + line)
}

func (r *fakeRunner) Start(ctx context.Context, name string, args ...string) (Process, error) {
	r.record("start " + strings.Join(append([]string{name}, args...), " "))
	if r.startErr != nil {
		return nil, r.startErr
	}
	p := &fakeProc{r: r, exit: make(chan struct{})}
	if r.exitEarly != nil {
		p.stop(r.exitEarly)
	}
	r.mu.Lock()
	r.proc, r.started = p, true
	r.mu.Unlock()
	return p, nil
}

// fakeProc is the tunnel: Wait returns when it is killed or stopped.
type fakeProc struct {
	r     *fakeRunner
	exit  chan struct{}
	once  sync.Once
	err   error
	kills int
}

func (p *fakeProc) stop(err error) {
	p.once.Do(func() {
		p.err = err
		close(p.exit)
	})
}

func (p *fakeProc) Kill() error {
	select {
	case <-p.exit:
		return os.ErrProcessDone
	default:
	}
	p.r.record("kill")
	p.r.mu.Lock()
	p.kills++
	p.r.mu.Unlock()
	if p.r.killErr != nil {
		return p.r.killErr
	}
	p.stop(errors.New("signal: killed"))
	return nil
}

func (p *fakeProc) Wait() error {
	<-p.exit
	return p.err
}

// fakeClock is a Clock that never waits for real. In auto mode, After lets
// the time pass at once: it moves Now on by d and fires. Otherwise timers
// fire only when Advance reaches them.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	auto    bool
	timers  []fakeTimer
	changed chan struct{} // closed and replaced when a timer is added
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newClock(auto bool) *fakeClock {
	return &fakeClock{now: epoch, auto: auto, changed: make(chan struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if c.auto {
		c.now = c.now.Add(d)
	}
	if c.auto || d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, fakeTimer{c.now.Add(d), ch})
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.ch <- c.now
	}
	c.timers = kept
}

func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// waitTimers blocks until n timers are pending.
func (c *fakeClock) waitTimers(n int) {
	for {
		c.mu.Lock()
		if len(c.timers) >= n {
			c.mu.Unlock()
			return
		}
		ch := c.changed
		c.mu.Unlock()
		<-ch
	}
}

// fakeInfo is a fs.FileInfo with just a mode.
type fakeInfo struct{ mode fs.FileMode }

func (i fakeInfo) Name() string       { return "" }
func (i fakeInfo) Size() int64        { return 0 }
func (i fakeInfo) Mode() fs.FileMode  { return i.mode }
func (i fakeInfo) ModTime() time.Time { return time.Time{} }
func (i fakeInfo) IsDir() bool        { return i.mode.IsDir() }
func (i fakeInfo) Sys() any           { return nil }

func fakeStat(files map[string]fs.FileMode) func(string) (fs.FileInfo, error) {
	return func(name string) (fs.FileInfo, error) {
		if m, ok := files[name]; ok {
			return fakeInfo{m}, nil
		}
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
	}
}
