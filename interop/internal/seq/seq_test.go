package seq

import (
	"hash/fnv"
	"testing"

	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// fingerprintCount packets of each sequence go into Fingerprint; the range
// includes the first near-4 MiB packet (index BigIndexOffset).
const fingerprintCount = 3000

// Fingerprint hashes (FNV-1a 64) the protobuf encodings of the first
// fingerprintCount packets of the four sequences.
func fingerprint(t *testing.T) uint64 {
	h := fnv.New64a()
	for tag := Tag(0); tag < 4; tag++ {
		for i := 0; i < fingerprintCount; i++ {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(Packet(tag, i))
			if err != nil {
				t.Fatalf("marshal %d/%d: %v", tag, i, err)
			}
			_, _ = h.Write(b)
		}
	}
	return h.Sum64()
}

// The Rust generator (core/tests/interop_support/seq.rs) pins the same
// value: if either recipe changes, both tests fail until both are updated.
const wantFingerprint = 0x45211699481bec9f

func TestFingerprintMatchesRust(t *testing.T) {
	if got := fingerprint(t); got != wantFingerprint {
		t.Fatalf("fingerprint = %#x, want %#x (the Go and Rust recipes diverged?)", got, uint64(wantFingerprint))
	}
}

func TestSequencesCoverTheEdges(t *testing.T) {
	const n = 10000
	for tag := Tag(0); tag < 4; tag++ {
		types := map[client.PacketType]int{}
		lens := map[int]bool{}
		ids := map[int64]bool{}
		var randomIDs, errs int
		for i := 0; i < n; i++ {
			p := Packet(tag, i)
			types[p.GetType()]++
			if d := p.GetData(); d != nil {
				lens[len(d.GetData())] = true
				ids[d.GetConnectID()] = true
				if d.GetError() != "" {
					errs++
				}
			}
			if r := p.GetDialRequest(); r != nil {
				ids[r.GetRandom()] = true
				if r.GetRandom() != 0 && !isSpecial(r.GetRandom()) {
					randomIDs++
				}
			}
		}
		if len(types) != 7 {
			t.Errorf("tag %d: %d packet types, want 7", tag, len(types))
		}
		for _, l := range []int{0, 16360, 16384, 65536, 100000, BigPayload} {
			if !lens[l] {
				t.Errorf("tag %d: no DATA payload of %d bytes", tag, l)
			}
		}
		for _, v := range specialIDs {
			if !ids[v] {
				t.Errorf("tag %d: id %d never used", tag, v)
			}
		}
		if randomIDs == 0 || errs == 0 {
			t.Errorf("tag %d: %d raw 64-bit randoms, %d DATA errors; want some of each", tag, randomIDs, errs)
		}
	}
}

func TestSequencesDiffer(t *testing.T) {
	for a := Tag(0); a < 4; a++ {
		for b := a + 1; b < 4; b++ {
			same := 0
			for i := 0; i < 100; i++ {
				if proto.Equal(Packet(a, i), Packet(b, i)) {
					same++
				}
			}
			// DRAIN packets are always equal; everything else should differ.
			if same > 100/14+1 {
				t.Errorf("tags %d and %d share %d of 100 packets", a, b, same)
			}
		}
	}
}

func TestBigPayloadFitsTheDefaultLimit(t *testing.T) {
	p := Packet(0, BigIndexOffset)
	if got := len(p.GetData().GetData()); got != BigPayload {
		t.Fatalf("index %d: payload %d, want %d", BigIndexOffset, got, BigPayload)
	}
	if size := proto.Size(p); size > 4<<20 {
		t.Fatalf("message of %d bytes exceeds grpc-go's 4 MiB receive limit", size)
	}
}

func isSpecial(v int64) bool {
	for _, s := range specialIDs {
		if s == v {
			return true
		}
	}
	return false
}

func TestCorruptAlwaysChangesThePacket(t *testing.T) {
	for i := 0; i < 100; i++ {
		p := Packet(0, i)
		Corrupt(p)
		if proto.Equal(p, Packet(0, i)) {
			t.Errorf("packet %d unchanged by Corrupt", i)
		}
	}
}
