//! The deterministic Packet sequences of the interop runs — the Rust twin of
//! `interop/internal/seq` (Go). Both ends compute every packet from its
//! sequence tag and index, so each received packet is compared with the one
//! the peer was meant to send. The recipe is spelled out in
//! `interop/README.md`; [`FINGERPRINT`] pins it on both sides.

use bytes::Bytes;
use konn_frames::packet::{ByteStr, Packet};

/// Which RPC a sequence belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `/AgentService/Connect`.
    Connect = 0,
    /// `/ProxyService/Proxy`.
    Proxy = 1,
}

impl Method {
    /// The gRPC path.
    pub fn path(self) -> &'static str {
        match self {
            Self::Connect => "/AgentService/Connect",
            Self::Proxy => "/ProxyService/Proxy",
        }
    }

    /// The method with this gRPC path.
    pub fn from_path(path: &[u8]) -> Option<Self> {
        [Self::Connect, Self::Proxy]
            .into_iter()
            .find(|m| m.path().as_bytes() == path)
    }
}

/// Who sends a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The client's packets.
    ClientToServer = 0,
    /// The server's packets.
    ServerToClient = 1,
}

/// The tag of the sequence `method`'s `dir` side sends.
pub fn tag(method: Method, dir: Direction) -> u64 {
    method as u64 * 2 + dir as u64
}

/// Indexes `i` with `i % BIG_INDEX_PERIOD == BIG_INDEX_OFFSET` carry
/// [`BIG_PAYLOAD`] bytes.
pub const BIG_INDEX_PERIOD: u32 = 4096;
/// See [`BIG_INDEX_PERIOD`] (even: always a DATA slot).
pub const BIG_INDEX_OFFSET: u32 = 2048;
/// Just under grpc-go's 4 MiB receive limit with the packet header.
pub const BIG_PAYLOAD: usize = (4 << 20) - 64;

/// DATA payload lengths for selectors 48..63.
const SIZES: [usize; 16] = [
    0, 1, 127, 128, 1000, 4096, 8192, 16359, 16360, 16361, 16384, 16385, 32768, 65535, 65536,
    100_000,
];

/// int64 values for id selectors 0..9.
const SPECIAL_IDS: [i64; 10] = [
    0,
    1,
    -1,
    2,
    2_147_483_647,
    2_147_483_648,
    -2_147_483_648,
    9_007_199_254_740_993,
    i64::MAX,
    i64::MIN,
];

/// FNV-1a 64 of the protobuf encodings of packets `0..3000` of tags 0..3,
/// as computed by the Go twin's test.
pub const FINGERPRINT: u64 = 0x4521_1699_481b_ec9f;

/// SplitMix64's output function.
pub fn mix(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn id(x: u64) -> i64 {
    let sel = ((x >> 56) % 16) as usize;
    SPECIAL_IDS.get(sel).copied().unwrap_or(x as i64)
}

fn text(s: String) -> ByteStr {
    ByteStr::from_utf8(Bytes::from(s)).expect("valid UTF-8")
}

fn err_text(i: u32) -> ByteStr {
    text(format!("failure #{i}: connexion refusée ✗"))
}

fn maybe_err(x: u64, bit: u32, i: u32) -> ByteStr {
    if (x >> bit) & 1 == 1 {
        err_text(i)
    } else {
        ByteStr::new()
    }
}

fn payload_len(x: u64, i: u32) -> usize {
    if i % BIG_INDEX_PERIOD == BIG_INDEX_OFFSET {
        return BIG_PAYLOAD;
    }
    let sel = ((x >> 16) % 64) as usize;
    match sel.checked_sub(48) {
        Some(k) => SIZES[k],
        None => ((x >> 24) % 2048) as usize,
    }
}

/// A DATA payload of `n` bytes derived from hash `x`.
pub fn payload(x: u64, n: usize) -> Bytes {
    (0..n)
        .map(|j| ((x >> (8 * (j % 8))) as u8) ^ (j as u64).wrapping_mul(7) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Packet `i` of sequence `tag`: DATA at even indexes, type `(i/2) % 7` at
/// odd ones.
pub fn packet(tag: u64, i: u32) -> Packet {
    let x = mix((tag << 32) | u64::from(i));
    let ty = if i.is_multiple_of(2) { 4 } else { (i / 2) % 7 };
    match ty {
        0 => Packet::DialReq {
            protocol: ByteStr::from_static(if (x >> 8).is_multiple_of(4) {
                "udp"
            } else {
                "tcp"
            }),
            address: text(format!("node-{}.konn.test:{}", x % 1000, (x >> 48) % 65536)),
            random: id(x),
        },
        1 => Packet::DialRsp {
            error: maybe_err(x, 40, i),
            connect_id: id(x),
            random: id(mix(x)),
        },
        2 => Packet::CloseReq { connect_id: id(x) },
        3 => Packet::CloseRsp {
            error: maybe_err(x, 40, i),
            connect_id: id(x),
        },
        4 => Packet::Data {
            connect_id: id(x),
            error: if (x >> 40).is_multiple_of(16) {
                err_text(i)
            } else {
                ByteStr::new()
            },
            data: payload(x, payload_len(x, i)),
        },
        5 => Packet::DialCls { random: id(x) },
        _ => Packet::Drain,
    }
}

/// `p` altered so it no longer equals itself, by the Go twin's rule: a DATA
/// payload gets its first byte flipped; any other packet becomes a DRAIN (a
/// DRAIN becomes a CLOSE_REQ). A test hook for checking that the peer
/// notices.
pub fn corrupt(p: Packet) -> Packet {
    match p {
        Packet::Data {
            connect_id,
            error,
            data,
        } if !data.is_empty() => {
            let mut d = data.to_vec();
            d[0] ^= 1;
            Packet::Data {
                connect_id,
                error,
                data: d.into(),
            }
        }
        Packet::Drain => Packet::CloseReq { connect_id: 1 },
        _ => Packet::Drain,
    }
}

/// A short description for mismatch reports (payloads summarised).
pub fn describe(p: &Packet) -> String {
    match p {
        Packet::Data {
            connect_id,
            error,
            data,
        } => format!(
            "Data {{ connect_id: {connect_id}, error: {:?}, data: {} bytes {:02x?}… }}",
            error.as_str(),
            data.len(),
            &data[..data.len().min(8)]
        ),
        other => format!("{other:?}"),
    }
}

/// FNV-1a 64 over the encodings of the first `count` packets of tags 0..3.
pub fn fingerprint(count: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut buf = Vec::new();
    for tag in 0..4 {
        for i in 0..count {
            buf.clear();
            packet(tag, i).encode(&mut buf);
            for &b in &buf {
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    h
}
