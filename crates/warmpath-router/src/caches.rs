//! The hot path's memo caches, seen from outside: how often each one saves
//! its work, for `GET /metrics` and `GET /cache-index`.
//!
//! | cache | pool | what it keeps | a hit saves |
//! |---|---|---|---|
//! | `content` | `-` (router-wide) | unescaped long message contents | unescaping (and, skimmed, reading) a repeated 28 KB system prompt |
//! | `segments` | each | token ids of long text pieces | tokenizing them |
//! | `short_pieces` | each | token ids of short pieces (a template's `\n\n`) | tokenizing them |
//! | `chat_heads` | each | block hashes of a chat's repeated beginning | rendering, tokenizing and hashing it |
//!
//! Low hit rates on a steady workload mean a cache is too small (or the
//! traffic has no repeated prefixes, and then `kv_aware` gains little).

use crate::state::Shared;
use serde_json::{json, Value};

/// One cache's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheReport {
    /// The pool's model, or `-` for the router-wide content cache.
    pub pool: String,
    /// Which cache (module docs).
    pub cache: &'static str,
    /// Lookups that found their entry.
    pub hits: u64,
    /// Lookups that did not (the work was done, and usually kept).
    pub misses: u64,
    /// Entries held now.
    pub entries: usize,
}

impl CacheReport {
    /// As listed by `GET /cache-index`.
    pub fn to_json(&self) -> Value {
        json!({
            "pool": self.pool,
            "cache": self.cache,
            "hits": self.hits,
            "misses": self.misses,
            "entries": self.entries,
        })
    }
}

/// Every cache's counters: the content cache first, then each pool's.
pub fn report(s: &Shared) -> Vec<CacheReport> {
    let c = s.contents.stats();
    let mut out = vec![CacheReport {
        pool: "-".into(),
        cache: "content",
        hits: c.hits,
        misses: c.misses,
        entries: c.entries,
    }];
    for p in s.pools.all() {
        let mut add = |cache, hits, misses, entries| {
            out.push(CacheReport {
                pool: p.model.clone(),
                cache,
                hits,
                misses,
                entries,
            });
        };
        if let Some(t) = &p.tokenizer {
            let (long, short) = (t.cache_stats(), t.short_cache_stats());
            add("segments", long.hits, long.misses, long.entries);
            add("short_pieces", short.hits, short.misses, short.entries);
        }
        let h = p.heads.stats();
        add("chat_heads", h.hits, h.misses, h.entries);
    }
    out
}

/// Sets `warmpath_hot_cache_hits_total`, `warmpath_hot_cache_misses_total`
/// and `warmpath_hot_cache_entries` (labels `pool`, `cache`).
pub fn update_metrics(s: &Shared) {
    for r in report(s) {
        let labels = [("pool", r.pool), ("cache", r.cache.to_owned())];
        metrics::counter!("warmpath_hot_cache_hits_total", &labels).absolute(r.hits);
        metrics::counter!("warmpath_hot_cache_misses_total", &labels).absolute(r.misses);
        metrics::gauge!("warmpath_hot_cache_entries", &labels).set(r.entries as f64);
    }
}
