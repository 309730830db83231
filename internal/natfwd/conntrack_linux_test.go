package natfwd

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const (
	nlaFNested       = 0x8000 // NLA_F_NESTED
	nlaFNetByteorder = 0x4000 // NLA_F_NET_BYTEORDER
)

type testTuple struct {
	src, dst     [4]byte
	proto        uint8
	sport, dport uint16
}

// encodeTuple writes a CTA_TUPLE_* as the kernel does: nested attributes
// flagged NLA_F_NESTED, ports and numbers big-endian.
func encodeTuple(tt testTuple) func(*netlink.AttributeEncoder) error {
	return func(ae *netlink.AttributeEncoder) error {
		ae.Nested(ctaTupleIP|nlaFNested, func(ae *netlink.AttributeEncoder) error {
			ae.Bytes(ctaIPv4Src, tt.src[:])
			ae.Bytes(ctaIPv4Dst, tt.dst[:])
			return nil
		})
		ae.Nested(ctaTupleProto|nlaFNested, func(ae *netlink.AttributeEncoder) error {
			ae.Uint8(ctaProtoNum, tt.proto)
			ae.Uint16(ctaProtoSrcPort|nlaFNetByteorder, tt.sport)
			ae.Uint16(ctaProtoDstPort|nlaFNetByteorder, tt.dport)
			return nil
		})
		return nil
	}
}

type testMsg struct {
	msgType        uint16
	flags          netlink.HeaderFlags
	family         uint8
	orig, reply    testTuple
	noReply        bool
	status         uint32
	counters       bool
	bytesO, bytesR uint64
}

func (m testMsg) build(t *testing.T) netlink.Message {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Nested(ctaTupleOrig|nlaFNested, encodeTuple(m.orig))
	if !m.noReply {
		ae.Nested(ctaTupleReply|nlaFNested, encodeTuple(m.reply))
	}
	ae.Uint32(ctaStatus|nlaFNetByteorder, m.status)
	if m.counters {
		ae.Nested(ctaCountersOrig|nlaFNested, func(ae *netlink.AttributeEncoder) error {
			ae.Uint64(1|nlaFNetByteorder, 7) // CTA_COUNTERS_PACKETS
			ae.Uint64(ctaCountersBytes|nlaFNetByteorder, m.bytesO)
			return nil
		})
		ae.Nested(ctaCountersReply|nlaFNested, func(ae *netlink.AttributeEncoder) error {
			ae.Uint64(1|nlaFNetByteorder, 5)
			ae.Uint64(ctaCountersBytes|nlaFNetByteorder, m.bytesR)
			return nil
		})
	}
	ae.Uint32(12|nlaFNetByteorder, 0xdeadbeef) // CTA_ID: ignored
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(m.msgType), Flags: m.flags},
		Data:   append([]byte{m.family, 0, 0, 0}, attrs...),
	}
}

var (
	// A client 10.0.0.2:40000 sent to 198.18.5.130:443, DNATed to 192.0.2.7:8443.
	natOrig  = testTuple{src: [4]byte{10, 0, 0, 2}, dst: [4]byte{198, 18, 5, 130}, proto: ProtoTCP, sport: 40000, dport: 443}
	natReply = testTuple{src: [4]byte{192, 0, 2, 7}, dst: [4]byte{10, 0, 0, 2}, proto: ProtoTCP, sport: 8443, dport: 40000}
)

const (
	typeNew    = nfnlSubsysCTNetlink<<8 | ipctnlMsgCTNew
	typeDelete = nfnlSubsysCTNetlink<<8 | ipctnlMsgCTDelete
)

func TestParseConntrackNew(t *testing.T) {
	msg := testMsg{msgType: typeNew, flags: netlink.Create | netlink.Excl, family: unix.AF_INET,
		orig: natOrig, reply: natReply, status: 1<<5 | 1<<3}.build(t)
	ev, ok, err := parseConntrack(msg)
	if err != nil || !ok {
		t.Fatalf("parseConntrack = %v, %v", ok, err)
	}
	want := ConnEvent{
		Type:     EventNew,
		Proto:    ProtoTCP,
		Src:      netip.MustParseAddrPort("10.0.0.2:40000"),
		Dst:      netip.MustParseAddrPort("198.18.5.130:443"),
		ReplySrc: netip.MustParseAddrPort("192.0.2.7:8443"),
		Status:   1<<5 | 1<<3,
	}
	if ev != want {
		t.Errorf("got %+v\nwant %+v", ev, want)
	}
}

func TestParseConntrackDestroy(t *testing.T) {
	orig, reply := natOrig, natReply
	orig.proto, reply.proto = protoUDP, protoUDP
	msg := testMsg{msgType: typeDelete, family: unix.AF_INET, orig: orig, reply: reply,
		status: 1 << 5, counters: true, bytesO: 102400 + 1<<40, bytesR: 999}.build(t)
	ev, ok, err := parseConntrack(msg)
	if err != nil || !ok {
		t.Fatalf("parseConntrack = %v, %v", ok, err)
	}
	want := ConnEvent{
		Type:       EventDestroy,
		Proto:      protoUDP,
		Src:        netip.MustParseAddrPort("10.0.0.2:40000"),
		Dst:        netip.MustParseAddrPort("198.18.5.130:443"),
		ReplySrc:   netip.MustParseAddrPort("192.0.2.7:8443"),
		BytesOrig:  102400 + 1<<40,
		BytesReply: 999,
		Status:     1 << 5,
	}
	if ev != want {
		t.Errorf("got %+v\nwant %+v", ev, want)
	}
}

func TestParseConntrackSkipped(t *testing.T) {
	icmpO, icmpR := natOrig, natReply
	icmpO.proto, icmpR.proto = 1, 1
	for name, m := range map[string]testMsg{
		"update":     {msgType: typeNew, family: unix.AF_INET, orig: natOrig, reply: natReply},
		"ipv6":       {msgType: typeNew, flags: netlink.Create, family: unix.AF_INET6, orig: natOrig, reply: natReply},
		"icmp":       {msgType: typeDelete, family: unix.AF_INET, orig: icmpO, reply: icmpR},
		"get":        {msgType: nfnlSubsysCTNetlink<<8 | 1, family: unix.AF_INET, orig: natOrig, reply: natReply},
		"expect":     {msgType: 2<<8 | ipctnlMsgCTNew, flags: netlink.Create, family: unix.AF_INET, orig: natOrig, reply: natReply},
		"nlmsg done": {msgType: uint16(netlink.Done)},
	} {
		ev, ok, err := parseConntrack(m.build(t))
		if ok || err != nil {
			t.Errorf("%s: parseConntrack = %+v, %v, %v; want skipped", name, ev, ok, err)
		}
	}
}

func TestParseConntrackMalformed(t *testing.T) {
	good := testMsg{msgType: typeDelete, family: unix.AF_INET, orig: natOrig, reply: natReply,
		counters: true, bytesO: 1, bytesR: 2}.build(t)
	// The two tuples come first; cutting the message anywhere in them is an
	// error; cutting it later (a torn optional attribute) is an error or an
	// event with the right addresses. Never a panic.
	ae := netlink.NewAttributeEncoder()
	ae.Nested(ctaTupleOrig|nlaFNested, encodeTuple(natOrig))
	ae.Nested(ctaTupleReply|nlaFNested, encodeTuple(natReply))
	tuples, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	tuplesEnd := nfgenmsgLen + len(tuples)
	for n := 0; n < len(good.Data); n++ {
		m := good
		m.Data = good.Data[:n]
		ev, ok, err := parseConntrack(m)
		switch {
		case n < tuplesEnd && (ok || err == nil):
			t.Errorf("truncated to %d bytes: ok %v, err %v, event %+v", n, ok, err, ev)
		case ok && (ev.Src != netip.MustParseAddrPort("10.0.0.2:40000") || ev.ReplySrc != netip.MustParseAddrPort("192.0.2.7:8443")):
			t.Errorf("truncated to %d bytes: parsed %+v", n, ev)
		}
	}
	noReply := testMsg{msgType: typeDelete, family: unix.AF_INET, orig: natOrig, noReply: true}.build(t)
	if _, ok, err := parseConntrack(noReply); ok || err == nil {
		t.Errorf("no reply tuple: ok %v, err %v", ok, err)
	}
	// An address of the wrong size.
	ae = netlink.NewAttributeEncoder()
	ae.Nested(ctaTupleOrig|nlaFNested, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(ctaTupleIP|nlaFNested, func(ae *netlink.AttributeEncoder) error {
			ae.Bytes(ctaIPv4Src, []byte{1, 2, 3})
			return nil
		})
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	bad := netlink.Message{Header: netlink.Header{Type: typeDelete}, Data: append([]byte{unix.AF_INET, 0, 0, 0}, b...)}
	if _, ok, err := parseConntrack(bad); ok || err == nil {
		t.Errorf("3-byte address: ok %v, err %v", ok, err)
	}
}
