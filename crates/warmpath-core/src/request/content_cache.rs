//! Unescaped message contents, kept by their JSON text.
//!
//! A long system prompt arrives in every request as the same JSON string
//! literal, with an escaped `\n` every few dozen bytes. Unescaping it is most
//! of what parsing the request costs (~700 escapes for 27 KB: ~10 µs warm,
//! several times that on a core that sat idle). [`ContentCache`] keeps the
//! unescaped text of long literals that hold escapes, keyed by the 128-bit
//! xxh3 of the literal's bytes and its length, so a repeated prompt (a shared
//! system prompt, the earlier turns of a conversation) is unescaped once and
//! shared ([`Content::Shared`](super::Content::Shared)) afterwards.
//!
//! The literal is located by serde_json (which also checks it), so a hit
//! costs one scan for the closing quote, one hash and one lookup instead of
//! an unescape into a growing buffer and a copy. A miss unescapes with
//! serde_json itself, so the text is always serde_json's.

use crate::weighted_lru::WeightedLru;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

/// Literals shorter than this many bytes are unescaped directly, never kept.
pub const MIN_LITERAL_BYTES: usize = 1024;

/// What identifies a shared content: the 128-bit xxh3 and the length of the
/// JSON literal it was unescaped from (equal literals, equal text). Lets a
/// reader that only needs the content's identity (the chat head key,
/// `crate::tokenize::head`) skip reading the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LiteralKey {
    /// xxh3-128 of the literal's bytes.
    pub hash: u128,
    /// The literal's length in bytes.
    pub len: usize,
}

impl LiteralKey {
    /// The key of JSON literal `lit`.
    pub fn of(lit: &str) -> Self {
        LiteralKey {
            hash: xxh3_128(lit.as_bytes()),
            len: lit.len(),
        }
    }
}

/// How many first bytes of a literal find its candidate lengths
/// ([`ContentCache::find_literal`]).
const START_BYTES: usize = 64;
/// Candidate lengths kept per start (literals that begin alike, e.g. two
/// versions of one system prompt), most recent first.
const LENGTHS_PER_START: usize = 4;
/// Starts remembered before the table is cleared (it refills as literals are
/// kept again); far above the number of long literals a cache holds.
const MAX_STARTS: usize = 1 << 14;

/// Default bound on the unescaped text kept (bytes).
pub const DEFAULT_CAPACITY_BYTES: usize = 32 << 20;

/// Counters of a [`ContentCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContentCacheStats {
    /// Literals found.
    pub hits: u64,
    /// Literals not found (unescaped, and kept when serde_json accepted them).
    pub misses: u64,
    /// Entries held now.
    pub entries: usize,
    /// Bytes of text held now.
    pub bytes: usize,
}

/// A bounded LRU of unescaped long string literals (see module docs).
pub struct ContentCache {
    capacity_bytes: usize,
    min_bytes: usize,
    lru: WeightedLru<str>,
    /// xxh3-64 of a kept literal's first [`START_BYTES`] bytes → lengths of
    /// the literals kept with that start (0: none).
    starts: RwLock<HashMap<u64, [usize; LENGTHS_PER_START]>>,
}

impl std::fmt::Debug for ContentCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentCache")
            .field("capacity_bytes", &self.capacity_bytes)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for ContentCache {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY_BYTES)
    }
}

impl ContentCache {
    /// A cache holding at most `capacity_bytes` of text (0: keeps nothing).
    pub fn new(capacity_bytes: usize) -> Self {
        ContentCache {
            capacity_bytes,
            min_bytes: MIN_LITERAL_BYTES,
            lru: WeightedLru::new(capacity_bytes),
            starts: RwLock::new(HashMap::new()),
        }
    }

    /// A cache that also keeps short literals (tests).
    #[cfg(test)]
    pub(crate) fn keeping_from(mut self, min_bytes: usize) -> Self {
        self.min_bytes = min_bytes;
        self
    }

    /// Whether a literal of `len` bytes goes through the cache.
    pub(crate) fn is_cacheable(&self, len: usize) -> bool {
        len >= self.min_bytes && len <= self.capacity_bytes
    }

    /// The text of the JSON string literal `lit` (quotes included, already
    /// checked by serde_json), from the cache or unescaped by serde_json and
    /// kept. `None` when serde_json refuses it (e.g. a lone surrogate).
    pub(crate) fn get_or_unescape(&self, lit: &str) -> Option<(Arc<str>, LiteralKey)> {
        let key = LiteralKey::of(lit);
        let text = match self.lru.get((key.hash, key.len)) {
            Some(text) => text,
            None => {
                let text: Arc<str> = Arc::from(serde_json::from_str::<String>(lit).ok()?);
                self.lru.insert((key.hash, key.len), Arc::clone(&text));
                text
            }
        };
        // Also on a hit: this literal was read in full, so its start was
        // not (or no longer) a candidate.
        self.remember_start(lit.as_bytes());
        Some((text, key))
    }

    /// The kept literal that `rest` starts with, found without scanning it:
    /// the candidate lengths come from `rest`'s first bytes, and a candidate
    /// counts only when the 128-bit xxh3 of that many bytes of `rest` is a
    /// kept literal's key. Only exact when `rest` starts where a JSON value
    /// starts (see `super::skim`). A stale candidate (its literal evicted)
    /// counts as a miss.
    pub(crate) fn find_literal(&self, rest: &[u8]) -> Option<(Arc<str>, LiteralKey)> {
        let start = xxh3_64(rest.get(..START_BYTES)?);
        let lens = *self.starts.read().get(&start)?;
        for len in lens {
            let Some(lit) = rest.get(..len).filter(|l| l.last() == Some(&b'"')) else {
                continue;
            };
            let key = LiteralKey {
                hash: xxh3_128(lit),
                len,
            };
            if let Some(text) = self.lru.get((key.hash, key.len)) {
                return Some((text, key));
            }
        }
        None
    }

    /// Makes `lit`'s length the first candidate of its start.
    fn remember_start(&self, lit: &[u8]) {
        let Some(start) = lit.get(..START_BYTES) else {
            return;
        };
        let start = xxh3_64(start);
        if self.starts.read().get(&start).map(|l| l[0]) == Some(lit.len()) {
            return;
        }
        let mut starts = self.starts.write();
        if starts.len() >= MAX_STARTS {
            starts.clear();
        }
        let lens = starts.entry(start).or_default();
        let mut next = [0; LENGTHS_PER_START];
        next[0] = lit.len();
        let older = lens.iter().filter(|&&l| l != lit.len());
        for (slot, &l) in next[1..].iter_mut().zip(older) {
            *slot = l;
        }
        *lens = next;
    }

    /// Counters and sizes.
    pub fn stats(&self) -> ContentCacheStats {
        let c = self.lru.counts();
        ContentCacheStats {
            hits: c.hits,
            misses: c.misses,
            entries: c.entries,
            bytes: c.size,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn lit(text: &str) -> String {
        serde_json::to_string(text).unwrap()
    }

    #[test]
    fn a_repeated_literal_is_unescaped_once_and_shared() {
        let c = ContentCache::new(1 << 20);
        let text = "line\n".repeat(400);
        let l = lit(&text);
        assert!(c.is_cacheable(l.len()));
        let (a, ka) = c.get_or_unescape(&l).unwrap();
        let (b, kb) = c.get_or_unescape(&l).unwrap();
        assert_eq!(&*a, text);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!((ka, kb), (LiteralKey::of(&l), LiteralKey::of(&l)));
        assert_ne!(ka, LiteralKey::of(&lit(&"line\n".repeat(401))));
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.entries, s.bytes), (1, 1, 1, 2000));
    }

    #[test]
    fn bounded_by_bytes_least_recent_out() {
        let c = ContentCache::new(5000);
        let lits: Vec<String> = (0..3)
            .map(|i| lit(&format!("{i}\n").repeat(1000)))
            .collect();
        for l in &lits {
            c.get_or_unescape(l).unwrap();
        }
        // 3 x 2000 bytes > 5000: the first went.
        let s = c.stats();
        assert_eq!((s.entries, s.bytes), (2, 4000));
        c.get_or_unescape(&lits[0]).unwrap();
        assert_eq!(c.stats().misses, 4);
        assert!(!ContentCache::new(0).is_cacheable(MIN_LITERAL_BYTES));
        assert!(!c.is_cacheable(MIN_LITERAL_BYTES - 1));
    }

    #[test]
    fn literals_that_begin_alike_are_all_found_by_their_start() {
        let c = ContentCache::new(1 << 20);
        let start = "the same first line, long enough for the probe\n".repeat(2);
        let lits: Vec<String> = (0..6)
            .map(|i| lit(&format!("{start}{}", "x".repeat(i))))
            .collect();
        for l in &lits {
            c.get_or_unescape(l).unwrap();
        }
        // The four most recent lengths are candidates; the two oldest are not.
        for (i, l) in lits.iter().enumerate() {
            assert_eq!(c.find_literal(l.as_bytes()).is_some(), i >= 2, "{i}");
        }
        // Seen again, an old one comes back to the front.
        c.get_or_unescape(&lits[0]).unwrap();
        assert!(c.find_literal(lits[0].as_bytes()).is_some());
        assert!(c.find_literal(lits[5].as_bytes()).is_some());
        assert!(c.find_literal(lits[2].as_bytes()).is_none());
    }

    #[test]
    fn refused_literals_are_not_kept() {
        let c = ContentCache::default();
        let bad = format!("\"{}\\ud800\"", "x".repeat(2000));
        assert!(c.get_or_unescape(&bad).is_none());
        assert_eq!(c.stats().entries, 0);
    }
}
