//! The pre-split's word cache: a short split and its ids inline in one fixed-size
//! entry keyed by xxh3-64 (a cold lookup touches one entry). The entry holds the
//! split's bytes, so a hash collision is only a miss.

use crate::weighted_lru::CacheStats;
use parking_lot::{RwLock, RwLockReadGuard};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use warmpath_hash::IdentityHasher;
use xxhash_rust::xxh3::xxh3_64;

/// Longest split kept, in bytes.
pub(crate) const INLINE_BYTES: usize = 22;
/// Most ids of a split kept.
pub(crate) const INLINE_IDS: usize = 6;

#[derive(Clone, Copy)]
struct Entry {
    len: u8,
    n: u8,
    word: [u8; INLINE_BYTES],
    ids: [u32; INLINE_IDS],
}

/// The keys are xxh3 hashes already.
type Table = HashMap<u64, Entry, BuildHasherDefault<IdentityHasher>>;

/// Bounded by entries.
pub(crate) struct WordCache {
    table: RwLock<Table>,
    capacity: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for WordCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WordCache")
            .field("entries", &self.table.read().len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// Read access for the splits of one piece.
pub(crate) struct Reader<'c>(RwLockReadGuard<'c, Table>);

impl Reader<'_> {
    /// The ids of `split`, when cached.
    pub(crate) fn get(&self, split: &str) -> Option<&[u32]> {
        if split.len() > INLINE_BYTES {
            return None;
        }
        let e = self.0.get(&xxh3_64(split.as_bytes()))?;
        (e.word[..usize::from(e.len)] == *split.as_bytes()).then(|| &e.ids[..usize::from(e.n)])
    }
}

impl WordCache {
    /// A cache of at most `capacity` splits; past that, splits are not added.
    pub(crate) fn new(capacity: usize) -> Self {
        WordCache {
            table: RwLock::new(Table::default()),
            capacity,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Whether `split` with `ids` fits an entry.
    pub(crate) fn fits(split: &str, ids: &[u32]) -> bool {
        split.len() <= INLINE_BYTES && ids.len() <= INLINE_IDS
    }

    /// Read access (hold it for one piece, not across requests).
    pub(crate) fn reader(&self) -> Reader<'_> {
        Reader(self.table.read())
    }

    /// Adds splits and their ids (those that do not fit are skipped).
    pub(crate) fn insert<'a>(&self, new: impl IntoIterator<Item = (&'a str, &'a [u32])>) {
        let mut table = self.table.write();
        for (split, ids) in new {
            if !Self::fits(split, ids) || table.len() >= self.capacity {
                continue;
            }
            let mut e = Entry {
                len: split.len() as u8,
                n: ids.len() as u8,
                word: [0; INLINE_BYTES],
                ids: [0; INLINE_IDS],
            };
            e.word[..split.len()].copy_from_slice(split.as_bytes());
            e.ids[..ids.len()].copy_from_slice(ids);
            table.insert(xxh3_64(split.as_bytes()), e);
        }
    }

    /// Adds one piece's lookups to the counters (once per piece, not per split).
    pub(crate) fn count(&self, hits: u64, misses: u64) {
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses.fetch_add(misses, Ordering::Relaxed);
    }

    /// Hits, misses, entries (`tokens` is not counted here: 0).
    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: self.table.read().len(),
            ..CacheStats::default()
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.read().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_what_was_put_and_nothing_else() {
        let c = WordCache::new(3);
        c.insert([
            ("Question", &[5u32][..]),
            (" what", &[6, 7]),
            ("x".repeat(INLINE_BYTES + 1).as_str(), &[1]),
            ("many", &[1, 2, 3, 4, 5, 6, 7]),
        ]);
        let r = c.reader();
        assert_eq!(r.get("Question"), Some(&[5u32][..]));
        assert_eq!(r.get(" what"), Some(&[6u32, 7][..]));
        assert_eq!(r.get("Questio"), None);
        assert_eq!(r.get(""), None);
        assert_eq!(r.get(&"x".repeat(INLINE_BYTES + 1)), None, "too long");
        assert_eq!(r.get("many"), None, "too many ids");
        drop(r);
        assert_eq!(c.len(), 2);
        c.insert([("a", &[1u32][..]), ("b", &[2])]);
        assert_eq!(c.len(), 3, "bounded");
        assert_eq!(c.reader().get("b"), None);
    }

    #[test]
    fn a_colliding_key_is_a_miss_not_a_wrong_hit() {
        let c = WordCache::new(10);
        c.insert([("abc", &[1u32][..])]);
        // Forge an entry under "abd"'s key holding "abc"'s bytes.
        let forged = *c
            .table
            .read()
            .get(&xxh3_64(b"abc"))
            .unwrap_or_else(|| unreachable!());
        c.table.write().insert(xxh3_64(b"abd"), forged);
        assert_eq!(c.reader().get("abd"), None);
        assert_eq!(c.reader().get("abc"), Some(&[1u32][..]));
    }
}
