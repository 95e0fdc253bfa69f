//! A bounded LRU of token ids for long text segments.
//!
//! Keyed by the 128-bit xxh3 of the segment's bytes plus its length; bounded by
//! the total number of cached token ids (a [`WeightedLru`]). Encoding happens
//! outside the lock, so concurrent misses for the same segment may both encode
//! it (same result).

use crate::weighted_lru::WeightedLru;
use std::sync::Arc;

/// Sizing of the segment cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Segments shorter than this many bytes are tokenized directly, never cached.
    pub min_segment_bytes: usize,
    /// Most token ids held in total; 0 turns the cache off.
    pub capacity_tokens: usize,
    /// Most token ids held for the short pieces (role names, the text
    /// between a template's special tokens, recent questions), which are
    /// kept in a second cache of their own so that a stream of distinct
    /// short pieces never evicts a long one; 0 turns it off.
    pub short_capacity_tokens: usize,
}

impl Default for CacheConfig {
    /// Segments of 2 KiB (about 500 tokens) and more; up to 4 Mi token ids
    /// (16 MiB of ids), e.g. 500 distinct 8k-token system prompts; and up to
    /// 64 Ki ids of shorter pieces.
    fn default() -> Self {
        CacheConfig {
            min_segment_bytes: 2048,
            capacity_tokens: 4 << 20,
            short_capacity_tokens: 1 << 16,
        }
    }
}

/// Counters of the segment cache (monotonic, except the two sizes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Long segments found in the cache.
    pub hits: u64,
    /// Long segments tokenized and inserted.
    pub misses: u64,
    /// Entries evicted to stay within capacity.
    pub evictions: u64,
    /// Segments held now.
    pub entries: usize,
    /// Token ids held now.
    pub tokens: usize,
}

/// The cache itself; share it behind the [`ChatTokenizer`](super::ChatTokenizer).
pub struct SegmentCache {
    config: CacheConfig,
    lru: WeightedLru<[u32]>,
}

impl std::fmt::Debug for SegmentCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentCache")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl SegmentCache {
    /// An empty cache.
    pub fn new(config: CacheConfig) -> Self {
        SegmentCache {
            config,
            lru: WeightedLru::new(config.capacity_tokens),
        }
    }

    /// The cache for the pieces shorter than `config.min_segment_bytes`:
    /// every non-empty piece goes in, within `config.short_capacity_tokens`.
    pub fn short_pieces(config: CacheConfig) -> Self {
        Self::new(CacheConfig {
            min_segment_bytes: 1,
            capacity_tokens: config.short_capacity_tokens,
            short_capacity_tokens: 0,
        })
    }

    /// The sizing.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// Whether a segment of `len` bytes goes through the cache.
    pub fn is_cacheable(&self, len: usize) -> bool {
        self.config.capacity_tokens > 0 && len >= self.config.min_segment_bytes
    }

    /// The ids of `segment`, from the cache or from `encode` (then cached when
    /// they fit). Errors from `encode` are passed through and nothing is cached.
    pub fn get_or_encode<E>(
        &self,
        segment: &str,
        encode: impl FnOnce(&str) -> Result<Vec<u32>, E>,
    ) -> Result<Arc<[u32]>, E> {
        self.lru
            .get_or_make(segment.as_bytes(), || encode(segment).map(Arc::from))
    }

    /// Current counters.
    pub fn stats(&self) -> CacheStats {
        let c = self.lru.counts();
        CacheStats {
            hits: c.hits,
            misses: c.misses,
            evictions: c.evictions,
            entries: c.entries,
            tokens: c.size,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn fake(s: &str) -> Result<Vec<u32>, ()> {
        Ok(s.bytes().map(u32::from).collect())
    }

    #[test]
    fn hits_after_a_miss_and_evicts_least_recent() {
        let c = SegmentCache::new(CacheConfig {
            min_segment_bytes: 1,
            capacity_tokens: 10,
            short_capacity_tokens: 0,
        });
        assert_eq!(&*c.get_or_encode("abcd", fake).unwrap(), &[97, 98, 99, 100]);
        assert_eq!(
            &*c.get_or_encode("abcd", |_| Err(())).unwrap(),
            &[97, 98, 99, 100]
        );
        c.get_or_encode("efgh", fake).unwrap();
        c.get_or_encode("abcd", fake).unwrap(); // abcd is now the most recent
        c.get_or_encode("ijkl", fake).unwrap(); // 12 > 10: efgh goes
        let s = c.stats();
        assert_eq!(
            (s.hits, s.misses, s.evictions, s.entries, s.tokens),
            (2, 3, 1, 2, 8)
        );
        assert!(
            c.get_or_encode("efgh", |_| Err(())).is_err(),
            "efgh was evicted"
        );
        assert!(
            c.get_or_encode("abcd", |_| Err(())).is_ok(),
            "abcd was kept"
        );
    }

    #[test]
    fn oversized_and_failed_segments_are_not_cached() {
        let c = SegmentCache::new(CacheConfig {
            min_segment_bytes: 1,
            capacity_tokens: 3,
            short_capacity_tokens: 0,
        });
        assert_eq!(c.get_or_encode("abcd", fake).unwrap().len(), 4);
        assert_eq!(c.stats().entries, 0);
        assert!(c.get_or_encode("ab", |_| Err(())).is_err());
        assert_eq!(c.stats().entries, 0);
        assert!(!SegmentCache::new(CacheConfig {
            min_segment_bytes: 1,
            capacity_tokens: 0,
            short_capacity_tokens: 0,
        })
        .is_cacheable(5));
        assert!(!c.is_cacheable(0) || c.config().min_segment_bytes == 0);
    }
}
