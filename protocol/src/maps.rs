//! Maps for connection ids: sized for one entry, hashed cheaply.
//!
//! ## `SmallMap`
//!
//! A kube-apiserver dial is one HTTP/2 connection with one stream, and an
//! agent tunnel one connection with one call; a `HashMap` holding that one
//! entry allocates four buckets (a 120-byte HTTP/2 stream: 520 bytes) and
//! hashes on every lookup. [`SmallMap`] keeps up to [`SmallMap::SPILL`]
//! entries in a vector that grows from one slot and is searched linearly,
//! and moves to a `HashMap` beyond that (a frontend multiplexing many
//! streams), back again once it is empty or [`SmallMap::shrink`] finds it
//! small.
//!
//! ## `IdMap`, `IdSet`
//!
//! The router, the tunnel and the binaries look up frontends, backends,
//! dials and connections by integer ids several times per packet and a
//! hundred times per dial; with std's SipHash that was 13 % of the
//! server's instructions per dial. [`IdHash`] hashes an integer with one
//! folded 64×64→128-bit multiply of the id and a per-map random key (the
//! key comes from std's `RandomState`, as a `HashMap`'s own keys do). Ids
//! are chosen by konn (frontend and backend ids), by authenticated peers
//! (an agent's connectIDs, kube-apiserver's dial randoms) and mixed with a
//! key they never see, so a peer cannot aim its ids at one bucket short of
//! learning the key from timing.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher};

/// A `HashMap` keyed by integer ids (see the module docs).
pub type IdMap<K, V> = HashMap<K, V, IdHash>;

/// A `HashSet` of integer ids (see the module docs).
pub type IdSet<K> = HashSet<K, IdHash>;

/// The keyed id hasher's builder: a random key per map.
#[derive(Clone, Copy, Debug)]
pub struct IdHash {
    key: u64,
}

impl Default for IdHash {
    fn default() -> Self {
        // std's per-map random keys (seeded from the OS once per thread,
        // then varied per map), folded into one 64-bit key.
        let key = std::collections::hash_map::RandomState::new().hash_one(0x6b6f_6e6e_u64);
        Self { key: key | 1 }
    }
}

impl BuildHasher for IdHash {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher(self.key)
    }
}

/// Hashes integers with a folded multiply by the key.
#[derive(Clone, Copy, Debug)]
pub struct IdHasher(u64);

/// A multiplier with well-spread bits (from PCG).
const MIX: u64 = 0x5851_f42d_4c95_7f2d;

impl IdHasher {
    fn mix(&mut self, v: u64) {
        let p = u128::from(self.0 ^ v) * u128::from(MIX);
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(c);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            if let Some(w) = word.get_mut(..rest.len()) {
                w.copy_from_slice(rest);
            }
            self.mix(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_i64(&mut self, n: i64) {
        self.mix(n as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

/// A map of a few entries in a vector, of many in a `HashMap` with hasher
/// `S`. Iteration order is unspecified (as a `HashMap`'s).
#[derive(Debug, Clone)]
pub enum SmallMap<K, V, S> {
    /// Up to [`SmallMap::SPILL`] entries.
    Few(Vec<(K, V)>),
    /// More.
    Many(HashMap<K, V, S>),
}

impl<K, V, S> Default for SmallMap<K, V, S> {
    fn default() -> Self {
        Self::Few(Vec::new())
    }
}

impl<K: Copy + Eq + Hash, V, S: BuildHasher + Default> SmallMap<K, V, S> {
    /// Entries kept in the vector before moving to a `HashMap`.
    pub const SPILL: usize = 8;

    /// An empty map (no allocation).
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries.
    pub fn len(&self) -> usize {
        match self {
            Self::Few(v) => v.len(),
            Self::Many(m) => m.len(),
        }
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of `k`.
    pub fn get(&self, k: &K) -> Option<&V> {
        match self {
            Self::Few(v) => v.iter().find(|(key, _)| key == k).map(|(_, v)| v),
            Self::Many(m) => m.get(k),
        }
    }

    /// The value of `k`, mutably.
    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        match self {
            Self::Few(v) => v.iter_mut().find(|(key, _)| key == k).map(|(_, v)| v),
            Self::Many(m) => m.get_mut(k),
        }
    }

    /// Whether `k` has a value.
    pub fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    /// Sets `k`'s value; returns the old one.
    pub fn insert(&mut self, k: K, value: V) -> Option<V> {
        match self {
            Self::Few(v) => {
                if let Some((_, old)) = v.iter_mut().find(|(key, _)| *key == k) {
                    return Some(std::mem::replace(old, value));
                }
                if v.len() < Self::SPILL {
                    if v.capacity() == 0 {
                        // Most maps here hold one entry for their life.
                        v.reserve_exact(1);
                    }
                    v.push((k, value));
                    return None;
                }
                let mut m = HashMap::with_capacity_and_hasher(2 * Self::SPILL, S::default());
                m.extend(v.drain(..));
                m.insert(k, value);
                *self = Self::Many(m);
                None
            }
            Self::Many(m) => m.insert(k, value),
        }
    }

    /// Removes `k`; returns its value.
    pub fn remove(&mut self, k: &K) -> Option<V> {
        match self {
            Self::Few(v) => {
                let i = v.iter().position(|(key, _)| key == k)?;
                let (_, value) = v.swap_remove(i);
                if v.is_empty() {
                    *v = Vec::new();
                }
                Some(value)
            }
            Self::Many(m) => {
                let value = m.remove(k);
                if m.is_empty() {
                    *self = Self::Few(Vec::new());
                }
                value
            }
        }
    }

    /// The keys.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// The values.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// The values, mutably.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.iter_mut().map(|(_, v)| v)
    }

    /// The entries, values mutably.
    pub fn iter_mut(&mut self) -> IterMut<'_, K, V> {
        match self {
            Self::Few(v) => IterMut::Few(v.iter_mut()),
            Self::Many(m) => IterMut::Many(m.iter_mut()),
        }
    }

    /// The entries.
    pub fn iter(&self) -> Iter<'_, K, V> {
        match self {
            Self::Few(v) => Iter::Few(v.iter()),
            Self::Many(m) => Iter::Many(m.iter()),
        }
    }

    /// Gives back memory the entries do not need: a `HashMap` that has
    /// become small moves back into a vector, a vector keeps only its
    /// entries (an idle connection's maps after a burst of streams).
    pub fn shrink(&mut self) {
        match self {
            Self::Few(v) => v.shrink_to_fit(),
            Self::Many(m) if m.len() <= Self::SPILL => {
                let mut v = Vec::with_capacity(m.len());
                v.extend(m.drain());
                *self = Self::Few(v);
            }
            Self::Many(m) => m.shrink_to_fit(),
        }
    }
}

/// Iterator over a [`SmallMap`]'s entries.
pub enum Iter<'a, K, V> {
    /// Over the vector.
    Few(std::slice::Iter<'a, (K, V)>),
    /// Over the `HashMap`.
    Many(std::collections::hash_map::Iter<'a, K, V>),
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Self::Few(i) => i.next().map(|(k, v)| (k, v)),
            Self::Many(i) => i.next(),
        }
    }
}

/// Iterator over a [`SmallMap`]'s entries, values mutably.
pub enum IterMut<'a, K, V> {
    /// Over the vector.
    Few(std::slice::IterMut<'a, (K, V)>),
    /// Over the `HashMap`.
    Many(std::collections::hash_map::IterMut<'a, K, V>),
}

impl<'a, K, V> Iterator for IterMut<'a, K, V> {
    type Item = (&'a K, &'a mut V);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Self::Few(i) => i.next().map(|(k, v)| (&*k, v)),
            Self::Many(i) => i.next(),
        }
    }
}

impl<'a, K: Copy + Eq + Hash, V, S: BuildHasher + Default> IntoIterator
    for &'a mut SmallMap<K, V, S>
{
    type Item = (&'a K, &'a mut V);
    type IntoIter = IterMut<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl<'a, K: Copy + Eq + Hash, V, S: BuildHasher + Default> IntoIterator for &'a SmallMap<K, V, S> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::RandomState;

    type M = SmallMap<u32, u64, RandomState>;

    #[test]
    fn behaves_as_a_hashmap_across_the_spill() {
        let mut m = M::new();
        let mut r: HashMap<u32, u64> = HashMap::new();
        // Insert, overwrite, remove in a pattern that crosses the spill
        // both ways several times.
        for round in 0..4u32 {
            for k in 0..(3 * M::SPILL as u32) {
                let key = k * 7 % 23 + round;
                assert_eq!(m.insert(key, u64::from(k)), r.insert(key, u64::from(k)));
                assert_eq!(m.len(), r.len());
            }
            for k in (0..23).step_by(2) {
                assert_eq!(m.remove(&k), r.remove(&k));
                assert_eq!(m.len(), r.len());
                assert_eq!(m.get(&(k + 1)), r.get(&(k + 1)));
            }
            m.shrink();
            let mut a: Vec<(u32, u64)> = m.iter().map(|(k, v)| (*k, *v)).collect();
            let mut b: Vec<(u32, u64)> = r.iter().map(|(k, v)| (*k, *v)).collect();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b);
        }
        for v in m.values_mut() {
            *v += 1;
        }
        assert!(
            m.keys()
                .all(|k| m.get(k) == r.get(k).map(|v| v + 1).as_ref())
        );
    }

    #[test]
    fn id_maps_spread_sequential_and_strided_ids() {
        for stride in [1u64, 2, 1 << 32, 1 << 48] {
            let b = IdHash::default();
            // Buckets are the low bits of the hash; count how many of 1024
            // ids share the fullest of 256 buckets.
            let mut buckets = [0u32; 256];
            for i in 0..1024u64 {
                let h = b.hash_one(i.wrapping_mul(stride));
                buckets[(h & 255) as usize] += 1;
            }
            let fullest = buckets.iter().max().copied().unwrap_or(0);
            assert!(
                fullest <= 16,
                "stride {stride}: {fullest} ids in one bucket"
            );
        }
        // Distinct keys per map.
        assert_ne!(
            IdHash::default().hash_one(7u64),
            IdHash::default().hash_one(7u64)
        );
        let mut m: IdMap<i64, u32> = IdMap::default();
        for i in -500..500 {
            m.insert(i, 1);
        }
        assert_eq!(m.len(), 1000);
    }

    #[test]
    fn one_entry_takes_one_slot_and_an_emptied_map_nothing() {
        let mut m = M::new();
        m.insert(1, 1);
        assert!(matches!(&m, SmallMap::Few(v) if v.capacity() == 1));
        assert_eq!(m.remove(&1), Some(1));
        assert!(matches!(&m, SmallMap::Few(v) if v.capacity() == 0));
        for k in 0..=M::SPILL as u32 {
            m.insert(k, 0);
        }
        assert!(matches!(m, SmallMap::Many(_)));
        for k in 1..=M::SPILL as u32 {
            m.remove(&k);
        }
        m.shrink();
        assert!(matches!(&m, SmallMap::Few(v) if v.len() == 1 && v.capacity() == 1));
        assert!(m.contains_key(&0));
    }
}
