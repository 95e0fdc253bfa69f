//! The hit-rate reference that keeps the engines' LRU eviction: an oracle
//! router (docs/bench.md, "Hit-rate references").

use crate::offline::{capped_hit, Fleet, InFlight, OptRequest, NEVER};
use warmpath_core::prefix_cache::{EngineBlockHash, PrefixCache};

/// The largest fleet the LRU references are computed for.
pub const MAX_BACKENDS: usize = 64;

/// Tokens hit by the oracle router (see the module docs); `None` above
/// [`MAX_BACKENDS`] backends or for items of several sizes.
pub(crate) fn lru_hits(trace: &[OptRequest], next: &[Vec<usize>], fleet: Fleet) -> Option<u64> {
    let mut sizes = trace.iter().flat_map(|r| r.items.iter().map(|i| i.1));
    let size = sizes.next().unwrap_or(1);
    if fleet.backends > MAX_BACKENDS || sizes.any(|s| s != size) {
        return None;
    }
    Some(oracle_hits(trace, next, fleet, size))
}

/// One backend's cache: an entry per item, its value the item's next use in
/// the trace as of its last access here.
#[derive(Clone)]
struct Lru(PrefixCache<usize>);

impl Lru {
    /// `n` empty caches of the fleet's capacity, for items of `size` blocks.
    fn fleet(fleet: Fleet, size: u32) -> Vec<Lru> {
        let items =
            usize::try_from(fleet.cache_blocks / u64::from(size.max(1))).unwrap_or(usize::MAX);
        (0..fleet.backends)
            .map(|_| match PrefixCache::new(1, items) {
                Ok(c) => Lru(c),
                Err(e) => unreachable!("a block size of 1 is valid: {e}"),
            })
            .collect()
    }

    /// Items of the longest prefix of `keys` held.
    fn prefix(&self, keys: &[EngineBlockHash]) -> u64 {
        keys.iter().take_while(|&&k| self.0.contains(k)).count() as u64
    }

    /// Stores a request's items (next used at `next[k]`, when known), as an
    /// engine stores a prompt's blocks; returns the items evicted.
    fn access(&mut self, keys: &[EngineBlockHash], next: Option<&[usize]>) -> Vec<EngineBlockHash> {
        let at = |k: usize| next.and_then(|n| n.get(k).copied()).unwrap_or(NEVER);
        let out = self.0.insert_chain(keys, at);
        for (k, &key) in keys.iter().enumerate().take(out.cached_blocks) {
            if let Some(v) = self.0.get_mut(key) {
                *v = at(k);
            }
        }
        out.removed
    }

    /// The next use of the soonest-needed item that writing `keys` here would
    /// evict ([`NEVER`] when it fits, or evicts only what is never used again).
    fn loss(&self, keys: &[EngineBlockHash]) -> usize {
        let gone = self.clone().access(keys, None);
        gone.iter()
            .filter_map(|&v| self.0.get(v).copied())
            .min()
            .unwrap_or(NEVER)
    }
}

/// The items of a request as the cache's keys.
fn keys(req: &OptRequest) -> Vec<EngineBlockHash> {
    req.items
        .iter()
        .map(|&(id, _)| EngineBlockHash(id))
        .collect()
}

/// Tokens hit by the oracle router on LRU engines, items of `size` blocks.
fn oracle_hits(trace: &[OptRequest], next: &[Vec<usize>], fleet: Fleet, size: u32) -> u64 {
    let n = fleet.backends;
    let mut caches = Lru::fleet(fleet, size);
    let mut load = InFlight::new(fleet);
    let mut hits = 0;
    for (r, req) in trace.iter().enumerate() {
        load.advance(req.arrival);
        let keys = keys(req);
        let room: Vec<usize> = (0..n).filter(|&b| load.room(b)).collect();
        let warm = room
            .iter()
            .map(|&b| (caches[b].prefix(&keys), b))
            .filter(|&(items, _)| items > 0)
            .max_by_key(|&(items, b)| (items, std::cmp::Reverse(load.of(b)), std::cmp::Reverse(b)));
        let (items, b) = warm.unwrap_or_else(|| {
            let b = room
                .iter()
                .copied()
                .max_by_key(|&b| {
                    let loss = caches[b].loss(&keys);
                    (loss, std::cmp::Reverse(load.of(b)), std::cmp::Reverse(b))
                })
                .unwrap_or(0);
            (0, b)
        });
        hits += capped_hit(items * u64::from(size), req, fleet);
        caches[b].access(&keys, next.get(r).map(Vec::as_slice));
        load.start(b, req.done.max(req.arrival));
    }
    hits
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "lru_refs_tests.rs"]
mod tests;
