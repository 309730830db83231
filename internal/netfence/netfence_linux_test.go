package netfence

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// inNetns runs fn on a locked thread in a network namespace of its own,
// with lo up, a veth d0 at 10.9.0.1/24 and the default route through it
// (its peer has no address: a packet the fence lets out is not answered),
// or skips
// the test when that cannot be made here (not root, no ip).
func inNetns(t *testing.T, fn func() error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2):", err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("skip: unshare(CLONE_NEWNET): %w", err)
			return
		}
		ns := fmt.Sprintf("--net=/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		for _, args := range [][]string{
			{"ip", "link", "set", "lo", "up"},
			{"ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"},
			{"ip", "addr", "add", "10.9.0.1/24", "dev", "d0"},
			{"ip", "link", "set", "d0", "up"},
			{"ip", "link", "set", "d1", "up"},
			{"ip", "route", "add", "default", "dev", "d0"},
		} {
			if out, err := exec.Command("nsenter", append([]string{ns, "--"}, args...)...).CombinedOutput(); err != nil {
				errc <- fmt.Errorf("skip: %v: %v: %s", args, err, out)
				return
			}
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		if msg := err.Error(); len(msg) > 5 && msg[:5] == "skip:" {
			t.Skip(msg)
		}
		t.Fatal(err)
	}
}

// refused sends a UDP datagram to addr:9 from the calling thread's
// namespace: nil when the fence refused it (EPERM: dropped on its way out,
// which the kernel tells a datagram's sender at once), else what happened.
func refused(addr string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	err = unix.Sendto(fd, []byte("fence"), 0, &unix.SockaddrInet4{Port: 9, Addr: netip.MustParseAddr(addr).As4()})
	switch {
	case errors.Is(err, unix.EPERM):
		return nil
	case err != nil:
		return fmt.Errorf("sending to %s: %v, want EPERM or nothing", addr, err)
	}
	return fmt.Errorf("a datagram to %s left", addr)
}

// TestFence: a fenced namespace sends only to loopback, the gateway and
// its virtual addresses; every other address is refused as the packet
// leaves (TCP too: the e2e tests show a connection fail). Check tells a fenced namespace from one that is not.
func TestFence(t *testing.T) {
	gw := netip.MustParseAddr("10.9.0.2")
	virtual := netip.MustParsePrefix("10.9.0.128/25")
	inNetns(t, func() error {
		if err := Check(); !errors.Is(err, ErrNotFenced) {
			return fmt.Errorf("Check before the fence = %v, want ErrNotFenced", err)
		}
		for _, a := range []string{"10.9.0.3", "10.9.0.200"} {
			if refused(a) == nil {
				return fmt.Errorf("%s refused before the fence", a)
			}
		}
		if err := Fence(gw, virtual); err != nil {
			return err
		}
		if err := Check(); err != nil {
			return fmt.Errorf("Check after the fence = %v", err)
		}
		for _, a := range []string{"10.9.0.3", "10.9.0.127", "192.0.2.1"} {
			if err := refused(a); err != nil {
				return fmt.Errorf("fenced: %w", err)
			}
		}
		// 10.9.0.1 is the namespace's own: it goes through loopback.
		for _, a := range []string{"10.9.0.2", "10.9.0.130", "127.0.0.1", "10.9.0.1"} {
			if refused(a) == nil {
				return fmt.Errorf("fenced: %s (the gateway, a virtual address, loopback) was refused", a)
			}
		}
		return nil
	})
}
