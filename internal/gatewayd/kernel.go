package gatewayd

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/propio/propio-sandbox/internal/gateway"
	"github.com/propio/propio-sandbox/internal/natfwd"
)

// kernelForwarding sets cfg up to forward allowed names in the kernel
// through the addresses of virtual, logs each connection it refuses as it is
// attempted and each it forwarded once it ends (logs reads them in the order
// they started). addr is the gateway's address on the sandbox network. It
// returns why it could not ("" when it did); the gateway then relays
// everything in user space.
func kernelForwarding(ctx context.Context, cfg *gateway.Config, virtual string, addr netip.Addr) string {
	prefix, err := netip.ParsePrefix(virtual)
	if err != nil {
		return fmt.Sprintf("--virtual %q: %v; relaying in user space", virtual, err)
	}
	w, err := natfwd.NewWatcher()
	if err != nil {
		return fmt.Sprintf("%v; relaying in user space", err)
	}
	fw, err := natfwd.Setup(prefix, gateway.DefaultCatchPort, gateway.DefaultRefusePort)
	if err != nil {
		w.Close()
		return fmt.Sprintf("%v; relaying in user space", err)
	}
	cfg.Kernel, cfg.Virtual = fw, prefix
	go func() {
		// The kernel sends a connection's DESTROY event, with its bytes, when
		// it removes the expired entry, which its own collection may leave
		// for a minute: sweep every two seconds, so the log is current.
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = natfwd.Sweep()
			}
		}
	}()
	go func() {
		defer w.Close()
		starts := map[[2]netip.AddrPort]time.Time{}
		_ = w.Run(ctx, func(ev natfwd.ConnEvent) {
			if ev.Proto != natfwd.ProtoTCP || !prefix.Contains(ev.Dst.Addr()) || ev.Status&natfwd.StatusDstNAT == 0 {
				return // not a connection the kernel forwarded
			}
			key := [2]netip.AddrPort{ev.Src, ev.Dst}
			switch {
			case ev.ReplySrc == netip.AddrPortFrom(addr, gateway.DefaultRefusePort):
				// Refused at its SYN: logged as it is attempted.
				if ev.Type == natfwd.EventNew {
					cfg.LogRefused(gateway.Conn{Start: time.Now(), Client: ev.Src, Dst: ev.Dst})
				}
				return
			case ev.ReplySrc == netip.AddrPortFrom(addr, gateway.DefaultCatchPort):
				return // the catch listener logs it
			}
			switch ev.Type {
			case natfwd.EventNew:
				if len(starts) < 65536 {
					starts[key] = time.Now()
				}
			case natfwd.EventDestroy:
				start, ok := starts[key]
				delete(starts, key)
				if !ok {
					start = time.Now()
				}
				cfg.LogForwarded(gateway.Conn{Start: start, Client: ev.Src, Dst: ev.Dst, Upstream: ev.ReplySrc,
					BytesUp: int64(ev.BytesOrig), BytesDown: int64(ev.BytesReply)})
			}
		})
	}()
	return ""
}
