// Package seq generates the deterministic Packet sequences that the interop
// peers exchange.
//
// Both ends of an interop run compute the same sequences independently (this
// package on the Go side, core/tests/interop_support/seq.rs on the Rust side),
// so every received packet can be compared field by field with the packet
// the sender was supposed to send, without shipping reference data around.
// The two implementations must stay in lock-step; README.md in the module
// root spells the recipe out.
//
// A sequence is identified by a Tag: the method (Connect or Proxy) and the
// direction (client to server or server to client), so that a stream that
// delivered another stream's packets, or echoed its own, is caught.
//
// The recipe is chosen to hit the codec's edges: every packet type, every
// field left at its default and set, DATA payloads from 0 bytes through the
// HTTP/2 frame size boundaries (16 360, 16 384, 16 385), past grpc-go's
// 64 KiB initial window, up to just under the 4 MiB message limit, and
// connect ids / randoms that need 1, 5, 9 and 10 varint bytes (including
// negative values, which protobuf encodes as 10-byte varints).
package seq

import (
	"fmt"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// Method selects the RPC a sequence belongs to.
type Method uint64

const (
	// Connect is /AgentService/Connect.
	Connect Method = 0
	// Proxy is /ProxyService/Proxy.
	Proxy Method = 1
)

// Direction is who sends a sequence.
type Direction uint64

const (
	// ClientToServer is the sequence the client sends.
	ClientToServer Direction = 0
	// ServerToClient is the sequence the server sends.
	ServerToClient Direction = 1
)

// Tag names one sequence.
type Tag uint64

// TagOf returns the tag of the sequence that m's d side sends.
func TagOf(m Method, d Direction) Tag {
	return Tag(uint64(m)*2 + uint64(d))
}

// BigIndexPeriod and BigIndexOffset place the near-4 MiB DATA packets:
// every index i with i%BigIndexPeriod == BigIndexOffset carries BigPayload
// bytes. (The offset is even, so that slot is always a DATA slot.)
const (
	BigIndexPeriod = 4096
	BigIndexOffset = 2048
	// BigPayload keeps the whole message (payload plus at most 24 bytes of
	// packet header) under grpc-go's 4 MiB default receive limit.
	BigPayload = 4<<20 - 64
)

// sizes are the DATA payload lengths picked by selectors 48..63.
var sizes = [16]int{
	0, 1, 127, 128, 1000, 4096, 8192, 16359,
	16360, 16361, 16384, 16385, 32768, 65535, 65536, 100000,
}

// specialIDs are the int64 values picked by id selectors 0..9.
var specialIDs = [10]int64{
	0, 1, -1, 2, 2147483647, 2147483648, -2147483648,
	9007199254740993, 9223372036854775807, -9223372036854775808,
}

// Mix is SplitMix64's output function: a cheap, well-spread 64-bit hash.
func Mix(z uint64) uint64 {
	z += 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// id turns a hash into an int64 field value: one of the special values
// most of the time, otherwise the raw 64 bits.
func id(x uint64) int64 {
	if sel := (x >> 56) % 16; sel < 10 {
		return specialIDs[sel]
	}
	return int64(x)
}

// errText is a non-ASCII (valid UTF-8) error string for index i.
func errText(i int) string {
	return fmt.Sprintf("failure #%d: connexion refusée ✗", i)
}

// maybeErr returns errText(i) when bit b of x is set, else "".
func maybeErr(x uint64, b uint, i int) string {
	if (x>>b)&1 == 1 {
		return errText(i)
	}
	return ""
}

// payloadLen is the DATA payload length of index i.
func payloadLen(x uint64, i int) int {
	if i%BigIndexPeriod == BigIndexOffset {
		return BigPayload
	}
	if sel := (x >> 16) % 64; sel >= 48 {
		return sizes[sel-48]
	}
	return int((x >> 24) % 2048)
}

// Payload fills a DATA payload of length n from hash x.
func Payload(x uint64, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(x>>(8*(uint(j)%8))) ^ byte(j*7)
	}
	return b
}

// Packet returns packet i of sequence t.
//
// Even indexes are DATA; odd index i carries type (i/2)%7, so every type
// appears every 14 packets.
func Packet(t Tag, i int) *client.Packet {
	x := Mix(uint64(t)<<32 | uint64(i))
	ty := client.PacketType_DATA
	if i%2 == 1 {
		ty = client.PacketType((i / 2) % 7)
	}
	p := &client.Packet{Type: ty}
	switch ty {
	case client.PacketType_DIAL_REQ:
		proto := "tcp"
		if (x>>8)%4 == 0 {
			proto = "udp"
		}
		p.Payload = &client.Packet_DialRequest{DialRequest: &client.DialRequest{
			Protocol: proto,
			Address:  fmt.Sprintf("node-%d.konn.test:%d", x%1000, (x>>48)%65536),
			Random:   id(x),
		}}
	case client.PacketType_DIAL_RSP:
		p.Payload = &client.Packet_DialResponse{DialResponse: &client.DialResponse{
			Error:     maybeErr(x, 40, i),
			ConnectID: id(x),
			Random:    id(Mix(x)),
		}}
	case client.PacketType_CLOSE_REQ:
		p.Payload = &client.Packet_CloseRequest{CloseRequest: &client.CloseRequest{
			ConnectID: id(x),
		}}
	case client.PacketType_CLOSE_RSP:
		p.Payload = &client.Packet_CloseResponse{CloseResponse: &client.CloseResponse{
			Error:     maybeErr(x, 40, i),
			ConnectID: id(x),
		}}
	case client.PacketType_DATA:
		err := ""
		if (x>>40)%16 == 0 {
			err = errText(i)
		}
		p.Payload = &client.Packet_Data{Data: &client.Data{
			ConnectID: id(x),
			Error:     err,
			Data:      Payload(x, payloadLen(x, i)),
		}}
	case client.PacketType_DIAL_CLS:
		p.Payload = &client.Packet_CloseDial{CloseDial: &client.CloseDial{
			Random: id(x),
		}}
	case client.PacketType_DRAIN:
		p.Payload = &client.Packet_Drain{Drain: &client.Drain{}}
	}
	return p
}

// Corrupt alters p in place so that it no longer equals the packet it was:
// a DATA payload gets its first byte flipped; any other packet becomes a
// DRAIN (a DRAIN becomes a CLOSE_REQ). Both peers implement the same rule,
// as a test hook for checking that the other side notices.
func Corrupt(p *client.Packet) {
	if d := p.GetData(); d != nil && len(d.Data) > 0 {
		d.Data[0] ^= 1
		return
	}
	if p.GetType() == client.PacketType_DRAIN {
		p.Type = client.PacketType_CLOSE_REQ
		p.Payload = &client.Packet_CloseRequest{CloseRequest: &client.CloseRequest{ConnectID: 1}}
		return
	}
	p.Type = client.PacketType_DRAIN
	p.Payload = &client.Packet_Drain{Drain: &client.Drain{}}
}
