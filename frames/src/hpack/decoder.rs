//! The HPACK decoder: one complete header block in, header fields out.
//!
//! The caller reassembles HEADERS + CONTINUATION fragments and hands the
//! whole block to [`Decoder::decode`], which calls back once per field with
//! a [`HeaderField`] borrowed from the block, the static table, the dynamic
//! table or a scratch buffer. Nothing is allocated per field: the only
//! allocations are the dynamic table's rings (at construction and when a
//! size update asks for a bigger table than ever before) and the growth of
//! the two Huffman scratch buffers to the longest string seen.
//!
//! What is checked:
//! - a dynamic table size update must come before the first field
//!   ([`Error::HpackSizeUpdateMisplaced`]) and must not exceed our
//!   SETTINGS_HEADER_TABLE_SIZE ([`Error::HpackSizeUpdateTooLarge`]);
//! - integers must fit in `u32` ([`Error::HpackIntegerOverflow`]);
//! - indices must name an entry ([`Error::HpackInvalidIndex`]);
//! - a string's declared length must be within [`DecoderLimits::max_string_len`]
//!   before it is read, and so must its Huffman-decoded length
//!   ([`Error::HpackStringTooLong`]); Huffman errors are
//!   [`Error::HpackInvalidHuffman`];
//! - too many representations or size updates in one block are
//!   [`Error::HpackWorkLimit`];
//! - a block that ends inside a representation is [`Error::HpackTruncated`];
//! - the header list size (RFC 9113: name + value + 32 per field) is summed;
//!   once it passes [`DecoderLimits::max_header_list_size`] no more fields
//!   are emitted, but the block is decoded to the end so the dynamic table
//!   matches the peer's, and [`Error::HeaderListTooLarge`] is returned.
//!
//! Every error but the last is a connection error: after it the decoder's
//! state is unspecified and the connection must be closed.

use super::table::{ENTRY_OVERHEAD, Table};
use super::{DEFAULT_TABLE_SIZE, HeaderField, huffman, int, static_table};
use crate::Error;

/// Per-block limits a [`Decoder`] enforces against hostile peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderLimits {
    /// Our SETTINGS_MAX_HEADER_LIST_SIZE: the largest header list delivered,
    /// counting name, value and 32 bytes per field. Default 64 KiB.
    pub max_header_list_size: u32,
    /// Longest name or value, both as sent and after Huffman decoding.
    /// Default 16 KiB.
    pub max_string_len: u32,
    /// Most field representations in one block. Default 1024.
    pub max_fields: u32,
    /// Most dynamic table size updates at the start of one block (a
    /// well-behaved encoder needs at most 2). Default 8.
    pub max_size_updates: u32,
}

impl Default for DecoderLimits {
    fn default() -> Self {
        Self {
            max_header_list_size: 64 * 1024,
            max_string_len: 16 * 1024,
            max_fields: 1024,
            max_size_updates: 8,
        }
    }
}

/// An HPACK decoder for one direction of one HTTP/2 connection.
#[derive(Clone, Debug)]
pub struct Decoder {
    /// The dynamic table, as the peer's encoder last sized it.
    table: Table,
    /// Our SETTINGS_HEADER_TABLE_SIZE: the bound on size updates.
    max_table_size: u32,
    /// Per-block limits.
    limits: DecoderLimits,
    /// Scratch space for a Huffman-decoded name, or a copied dynamic name.
    name_buf: Vec<u8>,
    /// Scratch space for a Huffman-decoded value.
    value_buf: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(DEFAULT_TABLE_SIZE)
    }
}

/// Where a decoded string lives.
#[derive(Clone, Copy)]
enum Str {
    /// A raw literal: `block[start..end]`.
    Raw(usize, usize),
    /// A Huffman literal, decoded into the scratch buffer it was read with.
    Scratch,
}

impl Str {
    /// The string's bytes.
    fn bytes<'a>(self, block: &'a [u8], scratch: &'a [u8]) -> &'a [u8] {
        match self {
            Self::Raw(start, end) => block.get(start..end).unwrap_or_default(),
            Self::Scratch => scratch,
        }
    }
}

/// Where a literal's name comes from.
#[derive(Clone, Copy)]
enum Name {
    /// Static table entry's name.
    Static(&'static [u8]),
    /// Dynamic table entry `i` (0 = newest).
    Dynamic(usize),
    /// A literal string.
    Literal(Str),
}

/// Delivers fields to the caller while the header list is within its
/// limit, and keeps measuring it after that.
struct Emitter<'e> {
    /// The caller's callback.
    emit: &'e mut dyn FnMut(HeaderField<'_>),
    /// Sum of name + value + 32 over every field, emitted or not.
    size: u64,
    /// Our SETTINGS_MAX_HEADER_LIST_SIZE.
    max: u32,
}

impl Emitter<'_> {
    /// Counts a field and emits it unless the list has outgrown the limit
    /// (then no later field is emitted either: the list stays a prefix).
    fn field(&mut self, name: &[u8], value: &[u8], never_indexed: bool) {
        let field = (name.len() + value.len() + ENTRY_OVERHEAD) as u64;
        self.size = self.size.saturating_add(field);
        // The size only grows, so once over the limit nothing more is emitted.
        if self.within_limit() {
            (self.emit)(HeaderField {
                name,
                value,
                never_indexed,
            });
        }
    }

    /// Whether everything counted so far fits the limit.
    fn within_limit(&self) -> bool {
        self.size <= u64::from(self.max)
    }

    /// The block's result once every representation is processed.
    fn finish(self) -> Result<(), Error> {
        if self.within_limit() {
            Ok(())
        } else {
            Err(Error::HeaderListTooLarge {
                size: self.size,
                max: self.max,
            })
        }
    }
}

/// Literal representation kinds, from their first-byte pattern.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Literal {
    /// `01xxxxxx`: add to the dynamic table.
    Incremental,
    /// `0000xxxx`: leave the table alone.
    Without,
    /// `0001xxxx`: leave the table alone; never index downstream.
    Never,
}

impl Decoder {
    /// A decoder for a connection on which we advertise
    /// SETTINGS_HEADER_TABLE_SIZE = `max_table_size`, with default limits.
    ///
    /// The dynamic table starts at `max_table_size`. On HTTP/2 that is the
    /// default 4096 until our SETTINGS is acknowledged; create the decoder
    /// with 4096 and call [`Decoder::set_max_table_size`] on the ACK.
    /// Memory: about `2 × max_table_size` bytes for the table ring.
    pub fn new(max_table_size: u32) -> Self {
        Self::with_limits(max_table_size, DecoderLimits::default())
    }

    /// Like [`Decoder::new`] with explicit limits.
    pub fn with_limits(max_table_size: u32, limits: DecoderLimits) -> Self {
        Self {
            table: Table::new(max_table_size as usize),
            max_table_size,
            limits,
            name_buf: Vec::new(),
            value_buf: Vec::new(),
        }
    }

    /// Gives back the scratch buffers of Huffman-decoded strings (they
    /// grow to the longest string seen); the next block that needs them
    /// allocates again. For an idle connection.
    pub fn release_scratch(&mut self) {
        self.name_buf = Vec::new();
        self.value_buf = Vec::new();
    }

    /// The per-block limits.
    pub fn limits(&self) -> DecoderLimits {
        self.limits
    }

    /// Replaces the per-block limits (e.g. when our
    /// SETTINGS_MAX_HEADER_LIST_SIZE changes).
    pub fn set_limits(&mut self, limits: DecoderLimits) {
        self.limits = limits;
    }

    /// Our advertised SETTINGS_HEADER_TABLE_SIZE.
    pub fn max_table_size(&self) -> u32 {
        self.max_table_size
    }

    /// Applies a new SETTINGS_HEADER_TABLE_SIZE of ours, once the peer has
    /// acknowledged it. Size updates above it are rejected from now on.
    ///
    /// Lowering it shrinks the table at once (evicting oldest entries):
    /// the peer's encoder must send a size update no larger than this at the
    /// start of its next block, which would evict the same entries. Should
    /// it fail to, anything it references that we dropped is an
    /// [`Error::HpackInvalidIndex`], never a wrong field, because both
    /// tables keep the newest entries.
    pub fn set_max_table_size(&mut self, max_table_size: u32) {
        self.max_table_size = max_table_size;
        if self.table.max_size() > max_table_size as usize {
            self.table.set_max_size(max_table_size as usize);
        }
    }

    /// Current dynamic table size (RFC 7541 §4.1 accounting).
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// Current dynamic table maximum size (set by the peer's size updates).
    pub fn table_max_size(&self) -> usize {
        self.table.max_size()
    }

    /// Number of dynamic table entries.
    pub fn table_len(&self) -> usize {
        self.table.len()
    }

    /// Dynamic table entries, newest (index 62) first, as `(name, value)`.
    pub fn dynamic_table(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.table.iter()
    }

    /// Decodes one complete header block, calling `emit` for each field in
    /// order.
    ///
    /// On [`Error::HeaderListTooLarge`] the fields emitted so far are a
    /// prefix of the list and the decoder remains usable (the stream is
    /// reset, the connection lives on). On any other error the connection
    /// must be closed.
    pub fn decode(
        &mut self,
        block: &[u8],
        emit: &mut dyn FnMut(HeaderField<'_>),
    ) -> Result<(), Error> {
        let mut out = Emitter {
            emit,
            size: 0,
            max: self.limits.max_header_list_size,
        };
        let mut fields = 0u32;
        let mut size_updates = 0u32;
        let mut pos = 0usize;
        while let Some(&first) = block.get(pos) {
            if first & 0xe0 == 0x20 {
                // 001xxxxx: dynamic table size update, only before fields.
                if fields > 0 {
                    return Err(Error::HpackSizeUpdateMisplaced);
                }
                size_updates += 1;
                if size_updates > self.limits.max_size_updates {
                    return Err(Error::HpackWorkLimit);
                }
                self.size_update(block, &mut pos)?;
                continue;
            }
            fields += 1;
            if fields > self.limits.max_fields {
                return Err(Error::HpackWorkLimit);
            }
            if first & 0x80 != 0 {
                // 1xxxxxxx: indexed header field.
                let index = int::decode(block, &mut pos, 7)?;
                let (name, value) = lookup(&self.table, index)?;
                out.field(name, value, false);
            } else {
                self.literal(block, &mut pos, first, &mut out)?;
            }
        }
        out.finish()
    }

    /// Decodes a dynamic table size update at `*pos` and applies it.
    fn size_update(&mut self, block: &[u8], pos: &mut usize) -> Result<(), Error> {
        let size = int::decode(block, pos, 5)?;
        if size > self.max_table_size {
            return Err(Error::HpackSizeUpdateTooLarge {
                size: u64::from(size),
                max: self.max_table_size,
            });
        }
        self.table.set_max_size(size as usize);
        Ok(())
    }

    /// Decodes a literal representation whose first byte is `first`,
    /// emits it and, for incremental indexing, adds it to the table.
    fn literal(
        &mut self,
        block: &[u8],
        pos: &mut usize,
        first: u8,
        out: &mut Emitter<'_>,
    ) -> Result<(), Error> {
        let Self {
            table,
            limits,
            name_buf,
            value_buf,
            ..
        } = self;
        let (kind, prefix) = match first {
            0x40.. => (Literal::Incremental, 6),
            0x10.. => (Literal::Never, 4),
            _ => (Literal::Without, 4),
        };
        let name_src = match int::decode(block, pos, prefix)? {
            0 => Name::Literal(read_string(block, pos, limits, name_buf)?),
            i => match static_table::get(i as usize) {
                Some((name, _)) => Name::Static(name),
                None => {
                    let d = i as usize - static_table::LEN - 1;
                    if d >= table.len() {
                        return Err(Error::HpackInvalidIndex {
                            index: u64::from(i),
                        });
                    }
                    Name::Dynamic(d)
                }
            },
        };
        let value = read_string(block, pos, limits, value_buf)?.bytes(block, value_buf);
        if kind != Literal::Incremental {
            let name: &[u8] = match name_src {
                Name::Static(name) => name,
                Name::Literal(s) => s.bytes(block, name_buf),
                Name::Dynamic(d) => table.get(d).unwrap_or_default().0,
            };
            out.field(name, value, kind == Literal::Never);
            return Ok(());
        }
        // The name must not borrow the table we are about to insert into:
        // the entry it names may be evicted by this very insertion (RFC 7541
        // §4.4), so a dynamic name is copied out first.
        let name: &[u8] = match name_src {
            Name::Static(name) => name,
            Name::Literal(s) => s.bytes(block, name_buf),
            Name::Dynamic(d) => {
                name_buf.clear();
                name_buf.extend_from_slice(table.get(d).unwrap_or_default().0);
                &name_buf[..]
            }
        };
        out.field(name, value, false);
        table.insert(name, value);
        Ok(())
    }
}

/// The entry at HPACK `index` (static 1..=61, then dynamic newest first).
fn lookup(table: &Table, index: u32) -> Result<(&[u8], &[u8]), Error> {
    let i = index as usize;
    let entry = match i.checked_sub(static_table::LEN + 1) {
        None => static_table::get(i),
        Some(d) => table.get(d),
    };
    entry.ok_or(Error::HpackInvalidIndex {
        index: u64::from(index),
    })
}

/// Reads a string literal at `*pos`: its length is checked against the
/// limit before the bytes are touched; a Huffman string is decoded into
/// `scratch`.
fn read_string(
    block: &[u8],
    pos: &mut usize,
    limits: &DecoderLimits,
    scratch: &mut Vec<u8>,
) -> Result<Str, Error> {
    let huffman = *block.get(*pos).ok_or(Error::HpackTruncated)? & 0x80 != 0;
    let len = int::decode(block, pos, 7)?;
    let max = limits.max_string_len;
    if len > max {
        return Err(Error::HpackStringTooLong {
            len: u64::from(len),
            max,
        });
    }
    let start = *pos;
    let end = start
        .checked_add(len as usize)
        .ok_or(Error::HpackTruncated)?;
    let bytes = block.get(start..end).ok_or(Error::HpackTruncated)?;
    *pos = end;
    if !huffman {
        return Ok(Str::Raw(start, end));
    }
    scratch.clear();
    huffman::decode(bytes, scratch)?;
    if scratch.len() > max as usize {
        return Err(Error::HpackStringTooLong {
            len: scratch.len() as u64,
            max,
        });
    }
    Ok(Str::Scratch)
}
