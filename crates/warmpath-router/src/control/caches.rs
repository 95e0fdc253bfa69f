//! The hot path's memo caches (`chunks`, `words`: docs/tokenization.md) seen
//! from outside, for `GET /metrics` and `GET /cache-index`.

use crate::control::state::Shared;
use serde::Serialize;

/// One cache's counters, as `GET /cache-index` lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct CacheReport {
    pub pool: String,
    /// Which cache (module docs).
    pub cache: &'static str,
    /// Lookups that found their entry.
    pub hits: u64,
    /// Lookups that did not (the work was done, and usually kept).
    pub misses: u64,
    pub entries: usize,
}

/// Every pool's caches' counters (a pool without a tokenizer has none).
pub(crate) fn report(s: &Shared) -> Vec<CacheReport> {
    let mut out = Vec::new();
    for p in &s.pools.all {
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
            let c = t.chunk_stats();
            add("chunks", c.hits, c.misses, c.entries);
            if let Some(w) = t.word_stats() {
                add("words", w.hits, w.misses, w.entries);
            }
        }
    }
    out
}

/// Sets the `warmpath_hot_cache_*` series.
pub(crate) fn update_metrics(s: &Shared) {
    for r in report(s) {
        let labels = [("pool", r.pool), ("cache", r.cache.to_owned())];
        metrics::counter!("warmpath_hot_cache_hits_total", &labels).absolute(r.hits);
        metrics::counter!("warmpath_hot_cache_misses_total", &labels).absolute(r.misses);
        metrics::gauge!("warmpath_hot_cache_entries", &labels).set(r.entries as f64);
    }
}
