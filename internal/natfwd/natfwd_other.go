//go:build !linux

package natfwd

import (
	"context"
	"errors"
	"net/netip"
)

var errNotLinux = errors.New("natfwd: kernel forwarding needs Linux")

// EventType is the kind of a conntrack event.
type EventType uint8

// The conntrack event types.
const (
	EventNew     EventType = iota + 1 // a connection entered the table
	EventDestroy                      // it left the table
)

// ConnEvent is one conntrack event of an IPv4 TCP or UDP connection.
type ConnEvent struct {
	Type                  EventType
	Proto                 uint8
	Src, Dst              netip.AddrPort
	ReplySrc              netip.AddrPort
	BytesOrig, BytesReply uint64
	Status                uint32
}

// WatchStats counts what a Watcher could not deliver.
type WatchStats struct {
	Overruns  uint64
	Malformed uint64
}

// Watcher is a subscription to conntrack events; it needs Linux.
type Watcher struct{}

// NewWatcher fails: kernel forwarding needs Linux.
func NewWatcher() (*Watcher, error) { return nil, errNotLinux }

// Run fails: kernel forwarding needs Linux.
func (w *Watcher) Run(ctx context.Context, fn func(ConnEvent)) error { return errNotLinux }

// Stats is always zero.
func (w *Watcher) Stats() WatchStats { return WatchStats{} }

// Close does nothing.
func (w *Watcher) Close() error { return nil }

// WatchConntrack fails: kernel forwarding needs Linux.
func WatchConntrack(ctx context.Context, fn func(ConnEvent)) (WatchStats, error) {
	return WatchStats{}, errNotLinux
}

// AddLocalRoute fails: kernel forwarding needs Linux.
func AddLocalRoute(p netip.Prefix) error { return errNotLinux }

// Sweep fails: kernel forwarding needs Linux.
func Sweep() error { return errNotLinux }
