//! The HPACK encoder: our request, response and trailer headers out.
//!
//! ## Policy ([`Encoder::encode`])
//! For each field, like grpc-go's encoder (golang.org/x/net/http2/hpack):
//! 1. sensitive → literal never indexed (with a name index when the name is
//!    in a table), so the value never enters any compression table;
//! 2. name and value in the static or dynamic table → indexed (static
//!    first: those indices are smaller and never go stale);
//! 3. otherwise a literal, with a name index when the name is in a table,
//!    added to the dynamic table unless the entry would take more than
//!    three quarters of it (such an entry would evict nearly everything
//!    useful for one field that is unlikely to repeat);
//! 4. each string is Huffman-coded only when that is strictly shorter.
//!
//! With [`Encoder::set_index_repeated_only`] (what konn's HTTP/2
//! connections use) step 3 adds a field to the table only the *second*
//! time the connection sends it. That costs one literal per repeated field
//! and saves the table for fields sent once: a connection that sends a
//! single header block (a kube-apiserver dial's response headers, an
//! agent's `Connect` request) never allocates a dynamic table (~350 bytes
//! per connection). The fields sent once are remembered as 32-bit hashes
//! of the last `SENT_ONCE` (8) such fields; a hash collision only makes a
//! field indexed one sending early. Without it the policy is grpc-go's,
//! which the RFC 7541 Appendix C examples follow.
//!
//! ## Table size
//! The encoder's table is at most `min(peer's SETTINGS_HEADER_TABLE_SIZE,
//! our cap)`; the cap (default 4096) bounds the memory a peer can make us
//! spend. Changes are signaled at the start of the next block, and when the
//! size dropped and rose again in between, the smallest value is signaled
//! first (RFC 7541 §4.2).
//!
//! ## Mechanism ([`Encoder::encode_field`])
//! An explicit [`Repr`] and Huffman choice per field, used to reproduce the
//! RFC 7541 Appendix C examples byte for byte and available for callers
//! with their own policy. [`Encoder::begin_block`] writes any pending size
//! update; [`Encoder::encode`] calls it itself.

use bytes::BufMut;

use super::table::{ENTRY_OVERHEAD, Table};
use super::{DEFAULT_TABLE_SIZE, Field, Repr, huffman, int, static_table};

/// Fields sent once (as literals not indexed) that the encoder remembers.
pub(super) const SENT_ONCE: usize = 8;

/// An HPACK encoder for one direction of one HTTP/2 connection.
#[derive(Clone, Debug)]
pub struct Encoder {
    /// Our copy of the peer decoder's dynamic table.
    table: Table,
    /// Largest table size we are willing to use.
    cap: u32,
    /// Size updates to signal at the start of the next block.
    pending: Option<PendingUpdate>,
    /// Index a field only the second time it is sent (see the module
    /// docs).
    repeated_only: bool,
    /// Hashes of the last fields sent once (see the module docs), a ring.
    sent_once: [u32; SENT_ONCE],
    /// Next slot of `sent_once`.
    sent_next: usize,
}

/// Table size changes since the last block.
#[derive(Clone, Copy, Debug)]
struct PendingUpdate {
    /// Smallest size in the interval.
    low: u32,
    /// Size to end with.
    last: u32,
}

/// How a string literal is coded.
#[derive(Clone, Copy)]
enum Huffman {
    /// Raw octets.
    Never,
    /// Huffman, whatever the length.
    Always,
    /// Huffman when strictly shorter.
    IfShorter,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    /// An encoder for a fresh HTTP/2 connection: table size 4096 (the
    /// protocol's initial value, so nothing needs signaling), cap 4096.
    pub fn new() -> Self {
        Self::with_table_size(DEFAULT_TABLE_SIZE)
    }

    /// An encoder whose table starts at `size` bytes with no size update
    /// pending, i.e. both sides already agree on `size` (as in the RFC 7541
    /// Appendix C examples). `size` is also the cap: peer limits above it
    /// are not used. Memory: about `2 × size` bytes.
    pub fn with_table_size(size: u32) -> Self {
        Self {
            table: Table::new(size as usize),
            cap: size,
            pending: None,
            repeated_only: false,
            sent_once: [0; SENT_ONCE],
            sent_next: 0,
        }
    }

    /// Adds a field to the dynamic table only the second time it is sent
    /// (see the module docs). Off by default.
    pub fn set_index_repeated_only(&mut self, on: bool) {
        self.repeated_only = on;
    }

    /// Applies the peer's SETTINGS_HEADER_TABLE_SIZE. The table size
    /// becomes `min(peer_limit, cap)`; if that changes anything, the next
    /// block starts with the size update(s).
    pub fn set_max_table_size(&mut self, peer_limit: u32) {
        let target = peer_limit.min(self.cap);
        let current = self.table.max_size() as u32;
        let mut pending = self.pending.unwrap_or(PendingUpdate {
            low: current,
            last: current,
        });
        pending.low = pending.low.min(target);
        pending.last = target;
        self.pending = (pending.low != current || pending.last != current).then_some(pending);
    }

    /// Current dynamic table size (RFC 7541 §4.1 accounting).
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// Current dynamic table maximum size (as last signaled).
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

    /// Encodes one header block with the policy in the module docs:
    /// pending size updates, then every field.
    pub fn encode<'a>(
        &mut self,
        fields: impl IntoIterator<Item = Field<'a>>,
        dst: &mut impl BufMut,
    ) {
        self.begin_block(dst);
        for field in fields {
            self.encode_with_policy(field, dst);
        }
    }

    /// Starts a block for [`Encoder::encode_field`]: writes the pending
    /// dynamic table size update(s), if any. Call it first in every block.
    pub fn begin_block(&mut self, dst: &mut impl BufMut) {
        let Some(PendingUpdate { low, last }) = self.pending.take() else {
            return;
        };
        let current = self.table.max_size() as u32;
        if low < current && low < last {
            self.size_update(low, dst);
        }
        self.size_update(last, dst);
    }

    /// Encodes one field with an explicit representation; `huffman` codes
    /// the literal name and value with Huffman whether or not that is
    /// shorter. Literals use a name index when the name is in a table
    /// (static first). [`Repr::Indexed`] for a field in neither table is
    /// sent as [`Repr::WithoutIndexing`].
    pub fn encode_field(
        &mut self,
        field: Field<'_>,
        repr: Repr,
        huffman: bool,
        dst: &mut impl BufMut,
    ) {
        let (full, name_index) = self.find(field, repr == Repr::Indexed);
        let literal = match (repr, full) {
            (Repr::Indexed, Some(index)) => {
                int::encode(index, 7, 0x80, dst);
                return;
            }
            (Repr::Indexed | Repr::WithoutIndexing, _) => Repr::WithoutIndexing,
            (other, _) => other,
        };
        let coding = if huffman {
            Huffman::Always
        } else {
            Huffman::Never
        };
        self.literal(field, name_index, literal, coding, dst);
    }

    /// [`Encoder::encode`]'s choice for one field.
    fn encode_with_policy(&mut self, field: Field<'_>, dst: &mut impl BufMut) {
        let (full, name_index) = self.find(field, !field.sensitive);
        if let Some(index) = full {
            int::encode(index, 7, 0x80, dst);
            return;
        }
        let repr = if field.sensitive {
            Repr::NeverIndexed
        } else if self.worth_indexing(field) && (!self.repeated_only || self.sent_before(field)) {
            Repr::IncrementalIndexing
        } else {
            Repr::WithoutIndexing
        };
        self.literal(field, name_index, repr, Huffman::IfShorter, dst);
    }

    /// Whether `field` was sent before (as a literal not indexed); if not,
    /// remembers that it now is.
    fn sent_before(&mut self, field: Field<'_>) -> bool {
        // FNV-1a over name, a separator and value; 0 marks an empty slot.
        let mut h: u32 = 0x811c_9dc5;
        for &b in field.name.iter().chain(&[0xff]).chain(field.value) {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        let h = h.max(1);
        if self.sent_once.contains(&h) {
            return true;
        }
        if let Some(slot) = self.sent_once.get_mut(self.sent_next) {
            *slot = h;
        }
        self.sent_next = (self.sent_next + 1) % SENT_ONCE;
        false
    }

    /// Whether adding `field` to the table is worth what it evicts.
    fn worth_indexing(&self, field: Field<'_>) -> bool {
        let size = field.name.len() + field.value.len() + ENTRY_OVERHEAD;
        size <= self.table.max_size() / 4 * 3
    }

    /// `(full match, name match)` as HPACK indices, static table first.
    fn find(&self, field: Field<'_>, with_value: bool) -> (Option<u64>, Option<u64>) {
        let (static_full, static_name) = static_table::find(field.name, field.value, with_value);
        if static_full.is_some() {
            return (static_full.map(u64::from), static_name.map(u64::from));
        }
        let (dyn_full, dyn_name) = self.table.find(field.name, field.value, with_value);
        let dynamic = |d: usize| (static_table::LEN + 1 + d) as u64;
        (
            dyn_full.map(dynamic),
            static_name.map(u64::from).or(dyn_name.map(dynamic)),
        )
    }

    /// Writes a literal representation and applies it to the table.
    fn literal(
        &mut self,
        field: Field<'_>,
        name_index: Option<u64>,
        repr: Repr,
        coding: Huffman,
        dst: &mut impl BufMut,
    ) {
        let (prefix, flags) = match repr {
            Repr::IncrementalIndexing => (6, 0x40),
            Repr::NeverIndexed => (4, 0x10),
            Repr::Indexed | Repr::WithoutIndexing => (4, 0x00),
        };
        match name_index {
            Some(index) => int::encode(index, prefix, flags, dst),
            None => {
                int::encode(0, prefix, flags, dst);
                write_string(field.name, coding, dst);
            }
        }
        write_string(field.value, coding, dst);
        if repr == Repr::IncrementalIndexing {
            self.table.insert(field.name, field.value);
        }
    }

    /// Writes a size update and applies it.
    fn size_update(&mut self, size: u32, dst: &mut impl BufMut) {
        int::encode(u64::from(size), 5, 0x20, dst);
        self.table.set_max_size(size as usize);
    }
}

/// Writes a string literal (RFC 7541 §5.2).
fn write_string(s: &[u8], coding: Huffman, dst: &mut impl BufMut) {
    let huffman_len = match coding {
        Huffman::Never => None,
        Huffman::Always => Some(huffman::encoded_len(s)),
        Huffman::IfShorter => Some(huffman::encoded_len(s)).filter(|&n| n < s.len()),
    };
    match huffman_len {
        Some(len) => {
            int::encode(len as u64, 7, 0x80, dst);
            huffman::encode(s, dst);
        }
        None => {
            int::encode(s.len() as u64, 7, 0x00, dst);
            dst.put_slice(s);
        }
    }
}
