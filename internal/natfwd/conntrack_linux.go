package natfwd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ctnetlink constants, from linux/netfilter/nfnetlink.h and
// linux/netfilter/nfnetlink_conntrack.h.
const (
	nfnlSubsysCTNetlink = 1 // NFNL_SUBSYS_CTNETLINK

	nfnlgrpConntrackNew     = 1 // NFNLGRP_CONNTRACK_NEW
	nfnlgrpConntrackDestroy = 3 // NFNLGRP_CONNTRACK_DESTROY

	ipctnlMsgCTNew    = 0 // IPCTNL_MSG_CT_NEW
	ipctnlMsgCTDelete = 2 // IPCTNL_MSG_CT_DELETE

	nfgenmsgLen = 4 // struct nfgenmsg: family, version, res_id (be16)

	ctaTupleOrig     = 1  // CTA_TUPLE_ORIG
	ctaTupleReply    = 2  // CTA_TUPLE_REPLY
	ctaStatus        = 3  // CTA_STATUS
	ctaCountersOrig  = 9  // CTA_COUNTERS_ORIG
	ctaCountersReply = 10 // CTA_COUNTERS_REPLY

	ctaTupleIP    = 1 // CTA_TUPLE_IP
	ctaTupleProto = 2 // CTA_TUPLE_PROTO

	ctaIPv4Src = 1 // CTA_IP_V4_SRC
	ctaIPv4Dst = 2 // CTA_IP_V4_DST

	ctaProtoNum     = 1 // CTA_PROTO_NUM
	ctaProtoSrcPort = 2 // CTA_PROTO_SRC_PORT
	ctaProtoDstPort = 3 // CTA_PROTO_DST_PORT

	ctaCountersBytes = 2 // CTA_COUNTERS_BYTES

	protoUDP = 17

	// watchReadBuffer is the receive buffer asked for the event socket:
	// a burst of connections must not overrun it.
	watchReadBuffer = 4 << 20
)

// EventType is the kind of a conntrack event.
type EventType uint8

// The conntrack event types.
const (
	EventNew     EventType = iota + 1 // a connection entered the table (NLM_F_CREATE set on IPCTNL_MSG_CT_NEW)
	EventDestroy                      // it left the table (IPCTNL_MSG_CT_DELETE)
)

// String returns "new" or "destroy".
func (t EventType) String() string {
	switch t {
	case EventNew:
		return "new"
	case EventDestroy:
		return "destroy"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// ConnEvent is one conntrack event of an IPv4 TCP or UDP connection.
type ConnEvent struct {
	Type     EventType
	Proto    uint8          // 6 TCP, 17 UDP
	Src, Dst netip.AddrPort // the original direction, as the client sent it (before DNAT)
	ReplySrc netip.AddrPort // the reply direction's source: where the connection really went (after DNAT)
	// IP bytes each way (CTA_COUNTERS_*): set on destroy when
	// net.netfilter.nf_conntrack_acct=1 in the namespace, else 0.
	BytesOrig, BytesReply uint64
	Status                uint32 // CTA_STATUS bits (IPS_DST_NAT = 1<<5 etc.)
}

// WatchStats counts what a Watcher could not deliver.
type WatchStats struct {
	// Overruns counts the receive buffer overruns (ENOBUFS): each one lost
	// an unknown number of events.
	Overruns uint64
	// Malformed counts the messages that could not be parsed and were skipped.
	Malformed uint64
}

// A Watcher is a subscription to the NEW and DESTROY conntrack events of
// one network namespace.
type Watcher struct {
	conn      *netlink.Conn
	overruns  atomic.Uint64
	malformed atomic.Uint64
}

// NewWatcher subscribes to the NEW and DESTROY conntrack events of the calling
// thread's network namespace: the socket is opened, and stays bound to that
// namespace, before NewWatcher returns, so a caller that switched namespaces
// on a locked thread may hand the Watcher to another goroutine. It fails at
// once when the subscription fails (no CAP_NET_ADMIN, no conntrack). The
// Watcher must be closed.
func NewWatcher() (*Watcher, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{
		Groups: 1<<(nfnlgrpConntrackNew-1) | 1<<(nfnlgrpConntrackDestroy-1),
	})
	if err != nil {
		return nil, fmt.Errorf("natfwd: subscribe to conntrack events: %w", err)
	}
	setReadBuffer(c, watchReadBuffer)
	return &Watcher{conn: c}, nil
}

// setReadBuffer enlarges the socket's receive buffer, past net.core.rmem_max
// when the caller may (CAP_NET_ADMIN), else up to it. Best effort.
func setReadBuffer(c *netlink.Conn, n int) {
	if rc, err := c.SyscallConn(); err == nil {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
		}); err == nil && serr == nil {
			return
		}
	}
	_ = c.SetReadBuffer(n)
}

// Run calls fn for each NEW and DESTROY event of an IPv4 TCP or UDP
// connection (others are skipped) until ctx ends; then it returns nil. fn runs
// on Run's goroutine, one event at a time: a slow fn makes the kernel drop
// events, counted in Stats. Overruns are not fatal; any other receive error
// is returned. Run must not be called twice at once.
//
// A DESTROY event comes when the kernel removes the expired entry, which may
// be some time after the connection ended (conntrack's garbage collection).
func (w *Watcher) Run(ctx context.Context, fn func(ConnEvent)) error {
	if err := w.conn.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("natfwd: conntrack events: %w", err)
	}
	stop := context.AfterFunc(ctx, func() {
		// Wake the blocked Receive up.
		_ = w.conn.SetReadDeadline(time.Unix(1, 0))
	})
	defer stop()
	for {
		msgs, err := w.conn.Receive()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				w.overruns.Add(1)
				continue
			}
			return fmt.Errorf("natfwd: receive conntrack events: %w", err)
		}
		for _, m := range msgs {
			ev, ok, err := parseConntrack(m)
			if err != nil {
				w.malformed.Add(1)
				continue
			}
			if ok {
				fn(ev)
			}
		}
	}
}

// Stats returns the counts of overruns and skipped messages so far.
func (w *Watcher) Stats() WatchStats {
	return WatchStats{Overruns: w.overruns.Load(), Malformed: w.malformed.Load()}
}

// Close ends the subscription. A running Run returns an error.
func (w *Watcher) Close() error { return w.conn.Close() }

// WatchConntrack subscribes to the NEW and DESTROY conntrack events of the
// calling thread's network namespace and calls fn for each IPv4 TCP/UDP event
// (others are skipped) until ctx ends; then it returns the watch's stats and
// nil. It returns an error at once when the subscription fails (no
// CAP_NET_ADMIN, no conntrack). fn runs on WatchConntrack's goroutine. Receive
// buffer overruns (ENOBUFS) are not fatal: they are counted in the stats and
// the watch goes on.
func WatchConntrack(ctx context.Context, fn func(ConnEvent)) (WatchStats, error) {
	w, err := NewWatcher()
	if err != nil {
		return WatchStats{}, err
	}
	defer w.Close()
	err = w.Run(ctx, fn)
	return w.Stats(), err
}

var errTruncated = errors.New("natfwd: truncated conntrack message")

// tuple is a decoded CTA_TUPLE_ORIG or CTA_TUPLE_REPLY.
type tuple struct {
	src, dst         netip.Addr
	proto            uint8
	sport, dport     uint16
	hasProto, hasIP4 bool
}

func (t *tuple) decode(ad *netlink.AttributeDecoder) error {
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleIP:
			ad.Nested(t.decodeIP)
		case ctaTupleProto:
			ad.Nested(t.decodeProto)
		}
	}
	return ad.Err()
}

func (t *tuple) decodeIP(ad *netlink.AttributeDecoder) error {
	for ad.Next() {
		var dst *netip.Addr
		switch ad.Type() {
		case ctaIPv4Src:
			dst = &t.src
		case ctaIPv4Dst:
			dst = &t.dst
		default:
			continue
		}
		b := ad.Bytes()
		if len(b) != 4 {
			return fmt.Errorf("natfwd: conntrack IPv4 address of %d bytes", len(b))
		}
		*dst = netip.AddrFrom4([4]byte(b))
	}
	t.hasIP4 = t.src.IsValid() && t.dst.IsValid()
	return ad.Err()
}

func (t *tuple) decodeProto(ad *netlink.AttributeDecoder) error {
	for ad.Next() {
		switch ad.Type() {
		case ctaProtoNum:
			t.proto = ad.Uint8()
			t.hasProto = true
		case ctaProtoSrcPort:
			t.sport = ad.Uint16()
		case ctaProtoDstPort:
			t.dport = ad.Uint16()
		}
	}
	return ad.Err()
}

func decodeBytes(v *uint64) func(*netlink.AttributeDecoder) error {
	return func(ad *netlink.AttributeDecoder) error {
		for ad.Next() {
			if ad.Type() == ctaCountersBytes {
				*v = ad.Uint64()
			}
		}
		return ad.Err()
	}
}

// parseConntrack decodes one ctnetlink event message. ok is false, with a
// nil error, for a message that is no NEW (with NLM_F_CREATE) or DESTROY event
// of an IPv4 TCP or UDP connection; a malformed message is an error.
func parseConntrack(msg netlink.Message) (ev ConnEvent, ok bool, err error) {
	if msg.Header.Type>>8 != nfnlSubsysCTNetlink {
		return ConnEvent{}, false, nil
	}
	switch msg.Header.Type & 0xff {
	case ipctnlMsgCTNew:
		if msg.Header.Flags&netlink.Create == 0 {
			return ConnEvent{}, false, nil // an update
		}
		ev.Type = EventNew
	case ipctnlMsgCTDelete:
		ev.Type = EventDestroy
	default:
		return ConnEvent{}, false, nil
	}
	if len(msg.Data) < nfgenmsgLen {
		return ConnEvent{}, false, errTruncated
	}
	if msg.Data[0] != unix.AF_INET {
		return ConnEvent{}, false, nil
	}
	ad, err := netlink.NewAttributeDecoder(msg.Data[nfgenmsgLen:])
	if err != nil {
		return ConnEvent{}, false, fmt.Errorf("natfwd: conntrack message: %w", err)
	}
	ad.ByteOrder = binary.BigEndian
	var orig, reply tuple
	var hasOrig, hasReply bool
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			ad.Nested(orig.decode)
			hasOrig = true
		case ctaTupleReply:
			ad.Nested(reply.decode)
			hasReply = true
		case ctaStatus:
			ev.Status = ad.Uint32()
		case ctaCountersOrig:
			ad.Nested(decodeBytes(&ev.BytesOrig))
		case ctaCountersReply:
			ad.Nested(decodeBytes(&ev.BytesReply))
		}
	}
	if err := ad.Err(); err != nil {
		return ConnEvent{}, false, fmt.Errorf("natfwd: conntrack message: %w", err)
	}
	if !hasOrig || !hasReply || !orig.hasProto {
		return ConnEvent{}, false, errTruncated
	}
	if orig.proto != ProtoTCP && orig.proto != protoUDP {
		return ConnEvent{}, false, nil
	}
	if !orig.hasIP4 || !reply.hasIP4 {
		return ConnEvent{}, false, errTruncated
	}
	ev.Proto = orig.proto
	ev.Src = netip.AddrPortFrom(orig.src, orig.sport)
	ev.Dst = netip.AddrPortFrom(orig.dst, orig.dport)
	ev.ReplySrc = netip.AddrPortFrom(reply.src, reply.sport)
	return ev, true, nil
}

// Sweep has the kernel remove the expired entries of the calling thread's
// network namespace's conntrack table now, which sends their DESTROY events.
// Left alone, the kernel's garbage collection may take a minute to come by;
// a dump of the table removes the expired entries it meets.
func Sweep() error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fmt.Errorf("natfwd: sweeping the conntrack table: %w", err)
	}
	defer c.Close()
	if _, err = c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  nfnlSubsysCTNetlink<<8 | 1, // IPCTNL_MSG_CT_GET
			Flags: netlink.Request | netlink.Dump,
		},
		Data: []byte{unix.AF_INET, 0, 0, 0}, // nfgenmsg, NFNETLINK_V0
	}); err != nil {
		return fmt.Errorf("natfwd: sweeping the conntrack table: %w", err)
	}
	return nil
}
