//! Maps sized for what connections hold: mostly one entry.
//!
//! A kube-apiserver dial is one HTTP/2 connection with one stream, and an
//! agent tunnel one connection with one call; a `HashMap` holding that one
//! entry allocates four buckets (a 120-byte HTTP/2 stream: 520 bytes) and
//! hashes on every lookup. [`SmallMap`] keeps up to [`SmallMap::SPILL`]
//! entries in a vector that grows from one slot and is searched linearly,
//! and moves to a `HashMap` beyond that (a frontend multiplexing many
//! streams), back again once it is empty or [`SmallMap::shrink`] finds it
//! small.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

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
