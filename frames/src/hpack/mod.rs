//! HPACK header compression (RFC 7541) for HTTP/2 header blocks.
//!
//! ```text
//!   HEADERS + CONTINUATION fragments, reassembled by the caller
//!        │
//!        ▼
//!   Decoder::decode(block, &mut |field| …)   ── one HeaderField per field,
//!        │  static table · dynamic table       borrowed, no allocation
//!        │  Huffman (nibble state machine)
//!        ▼
//!   name / value / never_indexed
//!
//!   Encoder::encode(fields, &mut BufMut)     ── request, response, trailers
//! ```
//!
//! ## Design
//! - **Both directions share one dynamic-table type** (`table.rs`): a byte
//!   ring plus an index ring, sized once from the table size, so inserting
//!   an entry never allocates. Lookups hand out slices of the ring.
//! - **The decoder does not allocate per field.** [`HeaderField`] borrows
//!   from the block, the static table, the dynamic table, or one of two
//!   reusable scratch buffers that hold Huffman-decoded strings. The decode
//!   loop is one non-generic function taking `&mut dyn FnMut`.
//! - **Hostile input is bounded.** Strings are checked against a length
//!   limit from their length prefix before they are read; the decoded
//!   header list is measured as RFC 9113 §6.5.2 says (name + value + 32)
//!   and, past the limit, fields are still decoded — so the dynamic table
//!   stays in sync with the peer — but no longer emitted, ending in
//!   [`Error::HeaderListTooLarge`](crate::Error::HeaderListTooLarge); the number of representations and of
//!   table size updates per block is capped ([`Error::HpackWorkLimit`](crate::Error::HpackWorkLimit),
//!   which maps to `ENHANCE_YOUR_CALM`). All other errors are
//!   `COMPRESSION_ERROR` connection errors.
//! - **The encoder has a policy and a mechanism.** [`Encoder::encode`]
//!   picks representations like grpc-go does (indexed on a full match,
//!   incremental indexing otherwise unless the field is sensitive or large,
//!   Huffman only when shorter); [`Encoder::encode_field`] takes an explicit
//!   [`Repr`] so the RFC 7541 Appendix C examples are reproducible byte for
//!   byte.
//! - **HPACK is byte-oriented**: names and values are `&[u8]`. Checking
//!   that names are lowercase tokens and values are valid field values is
//!   the HTTP/2 semantic layer's job.

mod decoder;
mod encoder;
pub mod huffman;
mod huffman_table;
mod int;
mod static_table;
mod table;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod vectors;

pub use decoder::{Decoder, DecoderLimits};
pub use encoder::Encoder;

/// The dynamic table size HTTP/2 starts with (SETTINGS_HEADER_TABLE_SIZE
/// default, RFC 9113 §6.5.2).
pub const DEFAULT_TABLE_SIZE: u32 = 4096;

/// A decoded header field, borrowed from the block, a table or the
/// decoder's scratch space; valid only during the callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderField<'a> {
    /// Field name bytes.
    pub name: &'a [u8],
    /// Field value bytes.
    pub value: &'a [u8],
    /// The peer sent it as "literal never indexed" (RFC 7541 §6.2.3):
    /// intermediaries must re-encode it the same way.
    pub never_indexed: bool,
}

/// A header field to encode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    /// Field name bytes (lowercase for HTTP/2).
    pub name: &'a [u8],
    /// Field value bytes.
    pub value: &'a [u8],
    /// Never put it in a compression table (e.g. `authorization`):
    /// [`Encoder::encode`] sends it as a literal never indexed, so neither
    /// this hop nor a later one can leak it through table probing.
    pub sensitive: bool,
}

impl<'a> Field<'a> {
    /// A field that may be indexed.
    pub const fn new(name: &'a [u8], value: &'a [u8]) -> Self {
        Self {
            name,
            value,
            sensitive: false,
        }
    }

    /// A field that must never be indexed.
    pub const fn sensitive(name: &'a [u8], value: &'a [u8]) -> Self {
        Self {
            name,
            value,
            sensitive: true,
        }
    }
}

impl<'a> From<HeaderField<'a>> for Field<'a> {
    /// Re-encoding a decoded field keeps its never-indexed marking.
    fn from(f: HeaderField<'a>) -> Self {
        Self {
            name: f.name,
            value: f.value,
            sensitive: f.never_indexed,
        }
    }
}

/// An HPACK field representation (RFC 7541 §6.1–§6.2), for
/// [`Encoder::encode_field`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repr {
    /// Indexed header field: the index of an identical table entry. A field
    /// in neither table is sent as [`Repr::WithoutIndexing`] instead, which
    /// like an indexed field leaves the table unchanged.
    Indexed,
    /// Literal with incremental indexing: added to the dynamic table.
    IncrementalIndexing,
    /// Literal without indexing: the table is unchanged.
    WithoutIndexing,
    /// Literal never indexed: the table is unchanged and intermediaries must
    /// keep it a literal.
    NeverIndexed,
}
