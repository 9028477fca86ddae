//! The HPACK dynamic table (RFC 7541 §2.3.2, §4), shared by the decoder and
//! the encoder.
//!
//! ## Representation
//! Two rings that grow on demand and no allocation per entry:
//! - `bytes`: one byte buffer of length `C` holding each entry's name
//!   immediately followed by its value. It starts empty and doubles (by a
//!   rebuild) whenever an insert needs `C ≥ 2 × (B + L)` (live bytes plus
//!   the new entry's), up to `2 × max_size`; so a connection whose peer
//!   inserts a few headers holds a few hundred bytes, not `2 × 4096`;
//! - `entries`: a `VecDeque` of `(start, name_len, value_len)`, newest at the
//!   front, grown as entries arrive.
//!
//! Entry positions are *virtual*: they only grow, and the physical offset is
//! `start % C`. An entry never straddles the physical end of the buffer: if
//! it would, it starts at the next multiple of `C` instead, leaving a gap.
//! Keeping every entry contiguous lets lookups return plain slices. Entries
//! are placed back to back, so the live bytes always span
//! `[oldest.start, write)`, and a new entry fits when that span plus the
//! entry stays within `C`.
//!
//! Why `C ≥ 2 × (B + L)` always suffices without evicting more than RFC 7541
//! asks (and `2 × max_size` is enough for that, as after the RFC eviction
//! `B + L < max_size`): the span holds `B`, at most one gap `g0`
//! (smaller than the entry right after it, which is live, so `g0 ≤ B`) and
//! possibly a new gap `g1 < L` before the new entry: `B + g0 + g1 + L <
//! 2(B + L) ≤ C`. The code still evicts further if the bound were ever
//! violated (a debug assertion flags it), so memory safety never rests on
//! the argument.
//!
//! Size accounting is the RFC's: `name.len() + value.len() + 32` per entry.

use std::collections::VecDeque;

/// Per-entry overhead in the RFC 7541 §4.1 size accounting.
pub(super) const ENTRY_OVERHEAD: usize = 32;

/// Smallest ring allocated once anything is inserted.
const MIN_RING: usize = 256;

/// Virtual positions are rebased before they could come near overflow.
const REBASE_AT: u64 = 1 << 62;

/// One dynamic table entry: where its bytes are and how they split.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// Virtual position of the first name byte.
    start: u64,
    /// Name length in bytes.
    name_len: usize,
    /// Value length in bytes.
    value_len: usize,
}

impl Entry {
    /// Bytes the entry occupies in the ring.
    fn bytes(&self) -> usize {
        self.name_len + self.value_len
    }

    /// Size in the RFC accounting.
    fn size(&self) -> usize {
        self.bytes() + ENTRY_OVERHEAD
    }
}

/// An HPACK dynamic table.
#[derive(Clone)]
pub(super) struct Table {
    /// Ring of entry bytes; its length `C` is at least `2 × max_size`.
    bytes: Vec<u8>,
    /// Entries, newest first.
    entries: VecDeque<Entry>,
    /// Virtual position after the newest entry's bytes.
    write: u64,
    /// Sum of entry sizes (RFC accounting).
    size: usize,
    /// Current maximum size (the last size update).
    max_size: usize,
}

impl core::fmt::Debug for Table {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Table")
            .field("entries", &self.entries.len())
            .field("size", &self.size)
            .field("max_size", &self.max_size)
            .finish()
    }
}

impl Table {
    /// An empty table with maximum size `max_size`.
    pub(super) fn new(max_size: usize) -> Self {
        Self {
            bytes: Vec::new(),
            entries: VecDeque::new(),
            write: 0,
            size: 0,
            max_size,
        }
    }

    /// Number of entries.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Current size in the RFC accounting.
    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// Current maximum size.
    pub(super) fn max_size(&self) -> usize {
        self.max_size
    }

    /// Entry `i` (0 = newest) as `(name, value)`.
    pub(super) fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        let entry = self.entries.get(i)?;
        Some(self.slices(entry))
    }

    /// Entries newest first, as `(name, value)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.entries.iter().map(|e| self.slices(e))
    }

    /// Looks up `(name, value)`: 0-based positions of the newest entry
    /// equal to both (only if `with_value`), and of the newest with `name`.
    pub(super) fn find(
        &self,
        name: &[u8],
        value: &[u8],
        with_value: bool,
    ) -> (Option<usize>, Option<usize>) {
        let mut name_match = None;
        for (i, entry) in self.entries.iter().enumerate() {
            if entry.name_len != name.len() {
                continue;
            }
            let (n, v) = self.slices(entry);
            if n != name {
                continue;
            }
            if with_value && v == value {
                return (Some(i), name_match.or(Some(i)));
            }
            if name_match.is_none() {
                name_match = Some(i);
                if !with_value {
                    break;
                }
            }
        }
        (None, name_match)
    }

    /// Applies a new maximum size: evicts down to it (the ring grows on the
    /// next insert that needs it).
    pub(super) fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }

    /// Inserts `(name, value)` as the newest entry, evicting as RFC 7541
    /// §4.4 says. An entry larger than the maximum size empties the table
    /// and is not added.
    pub(super) fn insert(&mut self, name: &[u8], value: &[u8]) {
        let len = name.len() + value.len();
        let size = len + ENTRY_OVERHEAD;
        if size > self.max_size {
            self.clear();
            return;
        }
        self.evict_to(self.max_size - size);
        let live = self.size - self.entries.len() * ENTRY_OVERHEAD;
        let need = 2 * (live + len);
        if need > self.bytes.len() || self.bytes.is_empty() {
            let grown = need.next_power_of_two().max(MIN_RING);
            self.rebuild(grown.min(ring_len(self.max_size)).max(need));
        }
        // Only if the ring invariant were broken.
        if len >= self.bytes.len() {
            self.clear();
            return;
        }
        let start = self.place(len);
        let ring = self.bytes.len() as u64;
        let p = (start % ring) as usize;
        // `place` guarantees `p + len <= ring`; `get_mut` keeps a broken
        // invariant from becoming a panic.
        if let Some(dst) = self.bytes.get_mut(p..p + len) {
            let (n, v) = dst.split_at_mut(name.len());
            n.copy_from_slice(name);
            v.copy_from_slice(value);
        } else {
            debug_assert!(false, "dynamic table placement out of bounds");
        }
        self.entries.push_front(Entry {
            start,
            name_len: name.len(),
            value_len: value.len(),
        });
        self.write = start + len as u64;
        self.size += size;
    }

    /// Finds the virtual start for `len` new bytes, evicting further only if
    /// the span bound (see module docs) were ever violated.
    fn place(&mut self, len: usize) -> u64 {
        let ring = self.bytes.len() as u64;
        let len = len as u64;
        loop {
            if self.write >= REBASE_AT {
                self.rebase();
            }
            let Some(oldest) = self.entries.back() else {
                self.write = 0;
                return 0;
            };
            let mut start = self.write;
            if start % ring + len > ring {
                start = start.div_ceil(ring) * ring;
            }
            if start + len - oldest.start <= ring {
                return start;
            }
            debug_assert!(false, "dynamic table ring too small");
            self.evict_oldest();
        }
    }

    /// Evicts oldest entries until the size is at most `target`.
    fn evict_to(&mut self, target: usize) {
        while self.size > target {
            if !self.evict_oldest() {
                break;
            }
        }
    }

    /// Removes the oldest entry; false if the table was empty.
    fn evict_oldest(&mut self) -> bool {
        match self.entries.pop_back() {
            Some(entry) => {
                self.size -= entry.size();
                if self.entries.is_empty() {
                    self.write = 0;
                }
                true
            }
            None => false,
        }
    }

    /// Drops every entry.
    fn clear(&mut self) {
        self.entries.clear();
        self.size = 0;
        self.write = 0;
    }

    /// Shifts all virtual positions down by whole rings (physical offsets
    /// unchanged).
    fn rebase(&mut self) {
        let ring = self.bytes.len() as u64;
        let Some(oldest) = self.entries.back() else {
            self.write = 0;
            return;
        };
        let base = oldest.start / ring * ring;
        for entry in &mut self.entries {
            entry.start -= base;
        }
        self.write -= base;
    }

    /// Moves the entries into a new ring of `ring_len` bytes, oldest first
    /// from offset 0.
    fn rebuild(&mut self, ring_len: usize) {
        let mut bytes = vec![0; ring_len];
        let mut write = 0usize;
        for i in (0..self.entries.len()).rev() {
            let entry = self.entries[i];
            let (name, value) = self.slices(&entry);
            let len = entry.bytes();
            if let Some(dst) = bytes.get_mut(write..write + len) {
                dst[..name.len()].copy_from_slice(name);
                dst[name.len()..].copy_from_slice(value);
            }
            self.entries[i].start = write as u64;
            write += len;
        }
        self.bytes = bytes;
        self.write = write as u64;
    }

    /// The name and value bytes of `entry`.
    fn slices(&self, entry: &Entry) -> (&[u8], &[u8]) {
        let ring = self.bytes.len() as u64;
        let p = entry.start.checked_rem(ring).unwrap_or(0) as usize;
        let bytes = self.bytes.get(p..p + entry.bytes()).unwrap_or_default();
        bytes.split_at_checked(entry.name_len).unwrap_or_default()
    }
}

/// Ring capacity for a maximum table size.
fn ring_len(max_size: usize) -> usize {
    max_size.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A straightforward model of the RFC table: a `VecDeque` of owned pairs.
    #[derive(Default)]
    struct Model {
        entries: VecDeque<(Vec<u8>, Vec<u8>)>,
        max_size: usize,
    }

    impl Model {
        fn size(&self) -> usize {
            self.entries
                .iter()
                .map(|(n, v)| n.len() + v.len() + 32)
                .sum()
        }
        fn evict(&mut self) {
            while self.size() > self.max_size {
                self.entries.pop_back();
            }
        }
        fn insert(&mut self, n: &[u8], v: &[u8]) {
            if n.len() + v.len() + 32 > self.max_size {
                self.entries.clear();
                return;
            }
            self.entries.push_front((n.to_vec(), v.to_vec()));
            self.evict();
        }
    }

    fn assert_same(table: &Table, model: &Model) {
        let got: Vec<_> = table
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        let want: Vec<_> = model.entries.iter().cloned().collect();
        assert_eq!(got, want);
        assert_eq!(table.size(), model.size());
        assert_eq!(table.max_size(), model.max_size);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(Vec<u8>, Vec<u8>),
        Resize(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (proptest::collection::vec(any::<u8>(), 0..40),
                  proptest::collection::vec(any::<u8>(), 0..120))
                .prop_map(|(n, v)| Op::Insert(n, v)),
            1 => (0usize..600).prop_map(Op::Resize),
        ]
    }

    proptest! {
        #[test]
        fn matches_model(initial in 0usize..600, ops in proptest::collection::vec(op(), 0..200)) {
            let mut table = Table::new(initial);
            let mut model = Model { max_size: initial, ..Model::default() };
            for op in ops {
                match op {
                    Op::Insert(n, v) => {
                        table.insert(&n, &v);
                        model.insert(&n, &v);
                    }
                    Op::Resize(max) => {
                        table.set_max_size(max);
                        model.max_size = max;
                        model.evict();
                    }
                }
                assert_same(&table, &model);
            }
        }
    }

    #[test]
    fn entry_exactly_max_size_fits_and_bigger_clears() {
        let mut t = Table::new(64);
        t.insert(b"abcd", b"1234");
        t.insert(b"n", &[7; 31]); // 1 + 31 + 32 = 64
        assert_eq!(t.len(), 1);
        assert_eq!(t.size(), 64);
        t.insert(b"n", &[7; 32]); // 65 > 64
        assert_eq!(t.len(), 0);
        assert_eq!(t.size(), 0);
    }

    #[test]
    fn zero_size_table_holds_nothing() {
        let mut t = Table::new(0);
        t.insert(b"", b"");
        assert_eq!(t.len(), 0);
        assert_eq!(t.get(0), None);
    }

    #[test]
    fn the_ring_grows_with_its_contents_and_never_past_twice_the_maximum() {
        let mut t = Table::new(4096);
        assert_eq!(
            t.bytes.len(),
            0,
            "nothing allocated before the first insert"
        );
        t.insert(b"user-agent", b"grpc-go/1.81.1");
        assert_eq!(t.bytes.len(), MIN_RING);
        for i in 0..200u32 {
            t.insert(b"x-key", format!("value-{i:04}-padding-padding").as_bytes());
            assert!(t.bytes.len() <= ring_len(4096));
            let live = t.size - t.len() * ENTRY_OVERHEAD;
            assert!(
                t.bytes.len() >= 2 * live,
                "ring {} < 2 x {live}",
                t.bytes.len()
            );
        }
        assert_eq!(t.get(0).map(|(n, _)| n), Some(&b"x-key"[..]));
    }

    #[test]
    fn empty_entries_are_distinct() {
        let mut t = Table::new(100);
        t.insert(b"", b"");
        t.insert(b"", b"");
        t.insert(b"a", b"b");
        assert_eq!(t.len(), 3);
        assert_eq!(t.size(), 98);
        assert_eq!(t.get(0), Some((&b"a"[..], &b"b"[..])));
        assert_eq!(t.get(2), Some((&b""[..], &b""[..])));
    }

    #[test]
    fn wraps_without_extra_eviction() {
        // Fill and cycle many times with uneven sizes; the model check in
        // `matches_model` covers correctness, this checks the ring wraps.
        let mut t = Table::new(256);
        let mut model = Model {
            max_size: 256,
            ..Model::default()
        };
        let mut furthest = 0;
        for i in 0..1000usize {
            let v = vec![b'x'; (i * 37) % 40];
            t.insert(b"k", &v);
            model.insert(b"k", &v);
            assert_same(&t, &model);
            furthest = furthest.max(t.write);
        }
        assert!(furthest > 2 * t.bytes.len() as u64);
    }

    #[test]
    fn rebase_keeps_contents() {
        let mut t = Table::new(128);
        t.insert(b"a", b"1");
        t.insert(b"b", b"2");
        let ring = t.bytes.len() as u64;
        // Pretend a very long history: shift everything by many rings.
        let shift = (REBASE_AT / ring + 1) * ring;
        for e in &mut t.entries {
            e.start += shift;
        }
        t.write += shift;
        t.insert(b"c", b"3");
        assert!(t.write < REBASE_AT);
        let got: Vec<_> = t.iter().collect();
        assert_eq!(got, [(&b"c"[..], &b"3"[..]), (b"b", b"2"), (b"a", b"1")]);
    }

    #[test]
    fn find_prefers_newest() {
        let mut t = Table::new(4096);
        t.insert(b"x", b"1");
        t.insert(b"x", b"2");
        t.insert(b"y", b"1");
        assert_eq!(t.find(b"x", b"1", true), (Some(2), Some(1)));
        assert_eq!(t.find(b"x", b"2", true), (Some(1), Some(1)));
        assert_eq!(t.find(b"x", b"3", true), (None, Some(1)));
        assert_eq!(t.find(b"x", b"1", false), (None, Some(1)));
        assert_eq!(t.find(b"z", b"1", true), (None, None));
    }
}
