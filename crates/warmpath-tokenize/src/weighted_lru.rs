//! A bounded LRU of token ids made from text (the chunk memo), keyed by the
//! xxh3-128 of the source bytes plus their length, bounded by the total ids
//! held. Values are made outside the lock, so concurrent misses may both make one.

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
    /// kept, evicting least recently used values past the capacity, unless it
    /// alone exceeds the capacity). Errors from `make` pass through.
    pub(crate) fn get_or_make<E>(
        &self,
        source: &[u8],
        make: impl FnOnce() -> Result<Arc<[u32]>, E>,
    ) -> Result<Arc<[u32]>, E> {
        let key = (xxh3_128(source), source.len());
        if let Some(v) = self.inner.lock().lru.get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(v));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let v = make()?;
        if v.len() > self.capacity {
            return Ok(v);
        }
        let mut inner = self.inner.lock();
        if let Some(old) = inner.lru.put(key, Arc::clone(&v)) {
            inner.size -= old.len();
        }
        inner.size += v.len();
        while inner.size > self.capacity {
            let Some((_, evicted)) = inner.lru.pop_lru() else {
                break;
            };
            inner.size -= evicted.len();
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(v)
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
