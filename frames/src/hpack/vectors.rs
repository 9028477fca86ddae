//! RFC 7541 Appendix C test vectors (C.2–C.6), as data.
//!
//! Each [`Sequence`] is a run of header blocks on one connection: the
//! encoded bytes, the header list with the representation the RFC used for
//! each field, and the dynamic table (newest first) and its size after the
//! block. C.2's examples are independent, so each is its own sequence.

use super::Repr::{
    self, IncrementalIndexing as Inc, Indexed as Idx, NeverIndexed, WithoutIndexing,
};

/// One header block of an example.
pub(super) struct Block {
    /// The RFC's hex dump, without spaces.
    pub(super) hex: &'static str,
    /// The header list, with the representation of each field.
    pub(super) fields: &'static [(&'static str, &'static str, Repr)],
    /// Dynamic table after the block, newest first.
    pub(super) table: &'static [(&'static str, &'static str)],
    /// Dynamic table size after the block.
    pub(super) table_size: usize,
}

/// Consecutive blocks on one connection.
pub(super) struct Sequence {
    /// RFC section.
    pub(super) name: &'static str,
    /// SETTINGS_HEADER_TABLE_SIZE both sides assume.
    pub(super) table_size: u32,
    /// Whether the RFC Huffman-coded the literals.
    pub(super) huffman: bool,
    /// The blocks in order.
    pub(super) blocks: &'static [Block],
}

const DATE_21: &str = "Mon, 21 Oct 2013 20:13:21 GMT";
const DATE_22: &str = "Mon, 21 Oct 2013 20:13:22 GMT";
const LOCATION: &str = "https://www.example.com";
const COOKIE: &str = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";

const REQ1: &[(&str, &str, Repr)] = &[
    (":method", "GET", Idx),
    (":scheme", "http", Idx),
    (":path", "/", Idx),
    (":authority", "www.example.com", Inc),
];
const REQ2: &[(&str, &str, Repr)] = &[
    (":method", "GET", Idx),
    (":scheme", "http", Idx),
    (":path", "/", Idx),
    (":authority", "www.example.com", Idx),
    ("cache-control", "no-cache", Inc),
];
const REQ3: &[(&str, &str, Repr)] = &[
    (":method", "GET", Idx),
    (":scheme", "https", Idx),
    (":path", "/index.html", Idx),
    (":authority", "www.example.com", Idx),
    ("custom-key", "custom-value", Inc),
];
const REQ_TABLE1: &[(&str, &str)] = &[(":authority", "www.example.com")];
const REQ_TABLE2: &[(&str, &str)] = &[
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];
const REQ_TABLE3: &[(&str, &str)] = &[
    ("custom-key", "custom-value"),
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];

const RESP1: &[(&str, &str, Repr)] = &[
    (":status", "302", Inc),
    ("cache-control", "private", Inc),
    ("date", DATE_21, Inc),
    ("location", LOCATION, Inc),
];
const RESP2: &[(&str, &str, Repr)] = &[
    (":status", "307", Inc),
    ("cache-control", "private", Idx),
    ("date", DATE_21, Idx),
    ("location", LOCATION, Idx),
];
const RESP3: &[(&str, &str, Repr)] = &[
    (":status", "200", Idx),
    ("cache-control", "private", Idx),
    ("date", DATE_22, Inc),
    ("location", LOCATION, Idx),
    ("content-encoding", "gzip", Inc),
    ("set-cookie", COOKIE, Inc),
];
const RESP_TABLE1: &[(&str, &str)] = &[
    ("location", LOCATION),
    ("date", DATE_21),
    ("cache-control", "private"),
    (":status", "302"),
];
const RESP_TABLE2: &[(&str, &str)] = &[
    (":status", "307"),
    ("location", LOCATION),
    ("date", DATE_21),
    ("cache-control", "private"),
];
const RESP_TABLE3: &[(&str, &str)] = &[
    ("set-cookie", COOKIE),
    ("content-encoding", "gzip"),
    ("date", DATE_22),
];

/// All of RFC 7541 C.2–C.6.
pub(super) const SEQUENCES: &[Sequence] = &[
    Sequence {
        name: "C.2.1",
        table_size: 4096,
        huffman: false,
        blocks: &[Block {
            hex: "400a637573746f6d2d6b65790d637573746f6d2d686561646572",
            fields: &[("custom-key", "custom-header", Inc)],
            table: &[("custom-key", "custom-header")],
            table_size: 55,
        }],
    },
    Sequence {
        name: "C.2.2",
        table_size: 4096,
        huffman: false,
        blocks: &[Block {
            hex: "040c2f73616d706c652f70617468",
            fields: &[(":path", "/sample/path", WithoutIndexing)],
            table: &[],
            table_size: 0,
        }],
    },
    Sequence {
        name: "C.2.3",
        table_size: 4096,
        huffman: false,
        blocks: &[Block {
            hex: "100870617373776f726406736563726574",
            fields: &[("password", "secret", NeverIndexed)],
            table: &[],
            table_size: 0,
        }],
    },
    Sequence {
        name: "C.2.4",
        table_size: 4096,
        huffman: false,
        blocks: &[Block {
            hex: "82",
            fields: &[(":method", "GET", Idx)],
            table: &[],
            table_size: 0,
        }],
    },
    Sequence {
        name: "C.3",
        table_size: 4096,
        huffman: false,
        blocks: &[
            Block {
                hex: "828684410f7777772e6578616d706c652e636f6d",
                fields: REQ1,
                table: REQ_TABLE1,
                table_size: 57,
            },
            Block {
                hex: "828684be58086e6f2d6361636865",
                fields: REQ2,
                table: REQ_TABLE2,
                table_size: 110,
            },
            Block {
                hex: "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
                fields: REQ3,
                table: REQ_TABLE3,
                table_size: 164,
            },
        ],
    },
    Sequence {
        name: "C.4",
        table_size: 4096,
        huffman: true,
        blocks: &[
            Block {
                hex: "828684418cf1e3c2e5f23a6ba0ab90f4ff",
                fields: REQ1,
                table: REQ_TABLE1,
                table_size: 57,
            },
            Block {
                hex: "828684be5886a8eb10649cbf",
                fields: REQ2,
                table: REQ_TABLE2,
                table_size: 110,
            },
            Block {
                hex: "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
                fields: REQ3,
                table: REQ_TABLE3,
                table_size: 164,
            },
        ],
    },
    Sequence {
        name: "C.5",
        table_size: 256,
        huffman: false,
        blocks: &[
            Block {
                hex: "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a\
                      323120474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d",
                fields: RESP1,
                table: RESP_TABLE1,
                table_size: 222,
            },
            Block {
                hex: "4803333037c1c0bf",
                fields: RESP2,
                table: RESP_TABLE2,
                table_size: 222,
            },
            Block {
                hex: "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69\
                      707738666f6f3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d6178\
                      2d6167653d333630303b2076657273696f6e3d31",
                fields: RESP3,
                table: RESP_TABLE3,
                table_size: 215,
            },
        ],
    },
    Sequence {
        name: "C.6",
        table_size: 256,
        huffman: true,
        blocks: &[
            Block {
                hex: "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29\
                      ad171863c78f0b97c8e9ae82ae43d3",
                fields: RESP1,
                table: RESP_TABLE1,
                table_size: 222,
            },
            Block {
                hex: "4883640effc1c0bf",
                fields: RESP2,
                table: RESP_TABLE2,
                table_size: 222,
            },
            Block {
                hex: "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7\
                      f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d50\
                      07",
                fields: RESP3,
                table: RESP_TABLE3,
                table_size: 215,
            },
        ],
    },
];

/// The header list of grpc-go's request when a Konnectivity agent connects.
pub(super) const GRPC_GO_REQUEST: [(&str, &str); 9] = [
    (":method", "POST"),
    (":scheme", "https"),
    (":path", "/AgentService/Connect"),
    (":authority", "127.0.0.1:8091"),
    ("content-type", "application/grpc"),
    ("user-agent", "grpc-go/1.81.1"),
    ("te", "trailers"),
    ("agentid", "6f1e2b4c-9a3d-4e7f-8b21-5c0d9e8f7a61"),
    ("agentidentifiers", "host=node1&ipv4=10.0.0.5"),
];

/// [`GRPC_GO_REQUEST`] as the first and second block of a connection,
/// produced by golang.org/x/net v0.62.0 `http2/hpack.Encoder` (the encoder
/// grpc-go uses): every field indexed or incrementally indexed, Huffman
/// when shorter.
pub(super) const GRPC_GO_BLOCKS: [&str; 2] = [
    "8387458f62198b527716cee62158bc7aaa2913418a089d5c0b8170dc780f875f8b1d75d0620d263d4c4d\
     65647a8a9acac8b4c7602bbc15c340027465864d833505b11f40851cc5a926939a72509451b4459f1b32\
     2cd15d9567a310566c8091f2bd2ba3703f408b1cc5a92690b524d298b623919ce84c151e4287e0d5f76a\
     0081702e05db",
    "8387c4c3c2c1c0bfbe",
];

/// Decodes a hex string (test data only; panics on bad hex).
pub(super) fn unhex(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digit"))
        .collect()
}
