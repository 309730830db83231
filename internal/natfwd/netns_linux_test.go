package natfwd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netns is a fresh network namespace owned by one locked OS thread. Every
// call that depends on the namespace (socket creation, /proc/sys writes, the
// package's netlink dials) must run on that thread: through do.
type netns struct {
	work     chan func()
	pid, tid int
}

// newNetns makes a network namespace on a new locked thread, or skips the test
// when that is impossible here. The thread is never unlocked, so it dies
// with its goroutine at the test's end, and the namespace with it.
func newNetns(t *testing.T) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace")
	}
	ns := &netns{work: make(chan func()), pid: os.Getpid()}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread must not go back to the pool
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		ns.tid = unix.Gettid()
		errc <- nil
		for fn := range ns.work {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		t.Skipf("cannot make a network namespace: unshare(CLONE_NEWNET): %v", err)
	}
	t.Cleanup(func() { close(ns.work) })
	ns.mustDo(t, func() error { return linkUp("lo") })
	return ns
}

// do runs fn on the namespace's thread.
func (ns *netns) do(fn func() error) error {
	errc := make(chan error, 1)
	ns.work <- func() { errc <- fn() }
	return <-errc
}

func (ns *netns) mustDo(t *testing.T, fn func() error) {
	t.Helper()
	if err := ns.do(fn); err != nil {
		t.Fatal(err)
	}
}

// path is the namespace's handle, for nsenter --net.
func (ns *netns) path() string { return fmt.Sprintf("/proc/%d/task/%d/ns/net", ns.pid, ns.tid) }

// linkUp sets IFF_UP on the named interface of the calling thread's namespace.
func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS %s: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS %s: %w", name, err)
	}
	return nil
}

// roundTrip dials addr on the namespace's thread, sends payload, closes, and
// checks that the listener's side got it all. It returns the client's
// address.
func roundTrip(t *testing.T, ns *netns, ln net.Listener, payload []byte) netip.AddrPort {
	t.Helper()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		got <- b
	}()
	var c net.Conn
	ns.mustDo(t, func() (err error) {
		c, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		return err
	})
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	client := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, payload) {
		t.Fatalf("listener got %d bytes, want %d", len(b), len(payload))
	}
	return netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
}

func TestAddLocalRoute(t *testing.T) {
	ns := newNetns(t)
	addr := "198.18.5.130:0"
	if err := ns.do(func() error {
		ln, err := net.Listen("tcp4", addr)
		if err == nil {
			ln.Close()
		}
		return err
	}); err == nil {
		t.Fatalf("listening on %s worked before the route", addr)
	}
	p := netip.MustParsePrefix("198.18.5.128/25")
	for range 2 { // idempotent
		ns.mustDo(t, func() error { return AddLocalRoute(p) })
	}
	var ln net.Listener
	ns.mustDo(t, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	defer ln.Close()
	roundTrip(t, ns, ln, []byte("hello through a local route"))

	if err := AddLocalRoute(netip.MustParsePrefix("2001:db8::/64")); err == nil {
		t.Error("AddLocalRoute of an IPv6 prefix: no error")
	}
}

const ctRuleset = `table ip natfwd_test {
	chain out {
		type filter hook output priority 0;
		ct state new counter
	}
}
`

func TestWatchConntrack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ns := newNetns(t)
	for _, bin := range []string{"nsenter", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s: %v", bin, err)
		}
	}
	// Conntrack tracks a namespace only once a ruleset uses it.
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+ns.path(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ctRuleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("cannot load an nftables ruleset using conntrack: %v: %s", err, out)
	}
	ns.mustDo(t, func() error {
		for name, v := range map[string]string{
			"nf_conntrack_acct":                   "1",
			"nf_conntrack_tcp_timeout_time_wait":  "1",
			"nf_conntrack_tcp_timeout_close_wait": "1",
			"nf_conntrack_tcp_timeout_last_ack":   "1",
		} {
			if err := os.WriteFile("/proc/sys/net/netfilter/"+name, []byte(v), 0); err != nil {
				return err
			}
		}
		return nil
	})

	var w *Watcher
	ns.mustDo(t, func() (err error) {
		w, err = NewWatcher()
		return err
	})
	defer w.Close()
	events := make(chan ConnEvent, 128)
	runErr := make(chan error, 1)
	runCtx, stopRun := context.WithCancel(ctx)
	go func() {
		runErr <- w.Run(runCtx, func(ev ConnEvent) {
			select {
			case events <- ev:
			case <-runCtx.Done():
			}
		})
	}()

	var ln net.Listener
	ns.mustDo(t, func() (err error) {
		ln, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	})
	defer ln.Close()
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	const size = 100 << 10
	src := roundTrip(t, ns, ln, bytes.Repeat([]byte("x"), size))
	t.Logf("connection %v -> %v closed", src, dst)
	start := time.Now()

	// The kernel removes an expired entry, and sends its DESTROY event, when
	// its garbage collection comes by, which may take a minute; a table dump
	// also removes the expired entries it meets: dump every 500 ms.
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var sawNew bool
	for {
		var ev ConnEvent
		select {
		case ev = <-events:
		case <-tick.C:
			if err := ns.do(Sweep); err != nil {
				t.Fatalf("conntrack dump: %v", err)
			}
			continue
		case <-ctx.Done():
			t.Fatalf("no DESTROY event (NEW seen: %v) after %v; stats %+v", sawNew, time.Since(start), w.Stats())
		}
		t.Logf("event %+v", ev)
		if ev.Proto != ProtoTCP || ev.Src != src {
			continue
		}
		if ev.Dst != dst || ev.ReplySrc != dst {
			t.Errorf("event %v: Dst %v, ReplySrc %v; want %v", ev.Type, ev.Dst, ev.ReplySrc, dst)
		}
		if ev.Type == EventNew {
			sawNew = true
			continue
		}
		if !sawNew {
			t.Error("DESTROY before NEW")
		}
		if ev.BytesOrig < size || ev.BytesReply == 0 {
			t.Errorf("DESTROY counters: %d bytes sent, %d replied; want >= %d and > 0", ev.BytesOrig, ev.BytesReply, size)
		}
		t.Logf("DESTROY %v after the close", time.Since(start))
		break
	}
	stopRun()
	if err := <-runErr; err != nil {
		t.Errorf("Run: %v", err)
	}
	if s := w.Stats(); s != (WatchStats{}) {
		t.Errorf("stats %+v", s)
	}
	// WatchConntrack, on the namespace's thread, returns nil once its context
	// ends.
	ns.mustDo(t, func() error {
		done, cancel := context.WithCancel(ctx)
		cancel()
		_, err := WatchConntrack(done, func(ConnEvent) {})
		return err
	})
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Error("test took 20 s")
	}
}
