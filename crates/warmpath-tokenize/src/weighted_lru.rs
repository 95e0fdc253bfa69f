//! A bounded LRU of token ids made from text (the chunk memo), keyed by the
//! xxh3-128 of the source bytes plus their length, bounded by the total ids held. Values are made outside the lock, so concurrent misses may both make one.

use lru::LruCache;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_128;

/// Counters of a memo cache (monotonic, except the two sizes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found their entry.
    pub hits: u64,
    /// Lookups that did not (encoded, then kept when they fit).
    pub misses: u64,
    /// Entries evicted to stay within capacity.
    pub evictions: u64,
    /// Entries held now.
    pub entries: usize,
    /// Token ids held now.
    pub tokens: usize,
}

#[derive(Debug)]
struct Inner {
    lru: LruCache<(u128, usize), Arc<[u32]>>,
    size: usize,
}

/// The cache (module docs), of token ids.
#[derive(Debug)]
pub(crate) struct WeightedLru {
    capacity: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl WeightedLru {
    /// A cache holding values of at most `capacity` in total.
    pub(crate) fn new(capacity: usize) -> Self {
        WeightedLru {
            capacity,
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                size: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The value made from `source`: from the cache, or from `make` (then
    /// kept when it fits). Errors from `make` pass through; nothing is kept.
    pub(crate) fn get_or_make<E>(
        &self,
        source: &[u8],
        make: impl FnOnce() -> Result<Arc<[u32]>, E>,
    ) -> Result<Arc<[u32]>, E> {
        let key = (xxh3_128(source), source.len());
        if let Some(v) = self.get(key) {
            return Ok(v);
        }
        let v = make()?;
        self.insert(key, Arc::clone(&v));
        Ok(v)
    }

    /// The value under `key` (a hit or a miss is counted).
    pub(crate) fn get(&self, key: (u128, usize)) -> Option<Arc<[u32]>> {
        let hit = self.inner.lock().lru.get(&key).map(Arc::clone);
        let counter = if hit.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        hit
    }

    /// Puts `v` under `key`, evicting least recently used values past the
    /// capacity; a value larger than the whole capacity is not kept.
    pub(crate) fn insert(&self, key: (u128, usize), v: Arc<[u32]>) {
        let size = v.len();
        if size > self.capacity {
            return;
        }
        let mut inner = self.inner.lock();
        if let Some(old) = inner.lru.put(key, v) {
            inner.size -= old.len();
        }
        inner.size += size;
        while inner.size > self.capacity {
            match inner.lru.pop_lru() {
                Some((_, evicted)) => {
                    inner.size -= evicted.len();
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                }
                None => break,
            }
        }
    }

    /// The bound on the total size of the values held.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let inner = self.inner.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries: inner.lru.len(),
            tokens: inner.size,
        }
    }
}
