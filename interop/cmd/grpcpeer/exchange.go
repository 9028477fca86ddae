package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"konn.local/interop/internal/seq"
)

// packetStream is what the generated Connect and Proxy streams of both
// roles have in common.
type packetStream interface {
	Send(*client.Packet) error
	Recv() (*client.Packet, error)
}

// methods maps the -method names to the sequence method and the gRPC path.
var methods = map[string]struct {
	seq  seq.Method
	path string
}{
	"connect": {seq.Connect, "/AgentService/Connect"},
	"proxy":   {seq.Proxy, "/ProxyService/Proxy"},
}

// stats is what one exchange moved.
type stats struct {
	sent, received           int
	bytesSent, bytesReceived int
	elapsed                  time.Duration
}

// exchange sends count packets of sequence out on s while receiving count
// packets and checking each against sequence in (packet corruptAt is sent
// altered, see seq.Corrupt; -1 for none); after the last packet it
// expects the end of the peer's side (io.EOF: a half-close for a server, an
// OK status for a client). afterSend runs once the last packet was sent (a
// client half-closes there).
//
// On a receive failure it returns at once; the sending goroutine then ends
// when the stream's context is cancelled (the handler returns, or the
// client cancels the call).
func exchange(s packetStream, count int, out, in seq.Tag, corruptAt int, afterSend func() error) (stats, error) {
	start := time.Now()
	type sendResult struct {
		n, bytes int
		err      error
	}
	sendDone := make(chan sendResult, 1)
	go func() {
		var r sendResult
		for ; r.n < count; r.n++ {
			p := seq.Packet(out, r.n)
			if r.n == corruptAt {
				seq.Corrupt(p)
			}
			if err := s.Send(p); err != nil {
				r.err = fmt.Errorf("send packet %d: %w", r.n, err)
				sendDone <- r
				return
			}
			r.bytes += proto.Size(p)
		}
		if afterSend != nil {
			r.err = afterSend()
		}
		sendDone <- r
	}()

	var st stats
	for ; st.received < count; st.received++ {
		got, err := s.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("stream ended early")
			}
			return st, fmt.Errorf("receive packet %d of %d: %w", st.received, count, err)
		}
		want := seq.Packet(in, st.received)
		if !proto.Equal(got, want) {
			return st, fmt.Errorf("packet %d differs: got %s; want %s%s",
				st.received, describe(got), describe(want), dataDiff(got, want))
		}
		st.bytesReceived += proto.Size(got)
	}
	if extra, err := s.Recv(); err == nil {
		return st, fmt.Errorf("packet %d beyond the expected %d: %s", count, count, describe(extra))
	} else if !errors.Is(err, io.EOF) {
		return st, fmt.Errorf("after %d packets: %w", count, err)
	}
	r := <-sendDone
	st.sent, st.bytesSent, st.elapsed = r.n, r.bytes, time.Since(start)
	return st, r.err
}

// describe prints a packet briefly: DATA payloads are summarised, not dumped.
func describe(p *client.Packet) string {
	if d := p.GetData(); d != nil {
		head := d.GetData()
		if len(head) > 8 {
			head = head[:8]
		}
		return fmt.Sprintf("{type:%v connectID:%d error:%q data:%d bytes %x… sum %x}",
			p.GetType(), d.GetConnectID(), d.GetError(), len(d.GetData()), head, checksum(d.GetData()))
	}
	return fmt.Sprintf("{%v}", p)
}

// dataDiff locates the first differing payload byte of two DATA packets.
func dataDiff(got, want *client.Packet) string {
	g, w := got.GetData(), want.GetData()
	if g == nil || w == nil {
		return ""
	}
	if i := firstDiff(g.GetData(), w.GetData()); i >= 0 {
		return fmt.Sprintf(" (payloads differ from byte %d)", i)
	}
	return ""
}

// checksum is a cheap content summary for mismatch reports.
func checksum(b []byte) uint32 {
	var h uint32 = 2166136261
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	return h
}

// firstDiff is the first offset where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func (s stats) String() string {
	return fmt.Sprintf("sent %d received %d packets (%.1f MB out, %.1f MB in) in %s",
		s.sent, s.received, float64(s.bytesSent)/1e6, float64(s.bytesReceived)/1e6,
		s.elapsed.Round(time.Millisecond))
}
