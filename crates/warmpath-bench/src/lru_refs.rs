//! Hit-rate references that keep the engines' LRU eviction (issue 21).
//!
//! [`crate::optimum`]'s bound lets the fleet's caches evict by Belady's rule,
//! which no router can impose on engines that evict the least recently used
//! blocks, as vLLM does. These two references route the same trace (prefills
//! in arrival order) over `n` LRU caches of the fleet's capacity each:
//!
//! - **Oracle router on LRU engines** ([`oracle_hits`]): the router knows the
//!   whole trace; the engines still evict LRU. A request goes, among the
//!   backends with room under the in-flight limit (as
//!   [`Optimum::reference`](crate::optimum::Optimum)), to the one holding the
//!   longest prefix of its chain (ties to the least loaded); a request no
//!   backend holds goes where writing it evicts the least: the backend whose
//!   soonest-needed victim is next used furthest in the future (room without
//!   evicting counts as never), then the least loaded. Greedy, so **a strong
//!   reference, not a bound**: a router that sends a warm request elsewhere to
//!   keep a cache for later could beat it.
//! - **Best static pinned set on LRU engines** ([`pinned_hits`]): requests
//!   are grouped by their first item (the prefix key: a document in `scale`,
//!   a system prompt's first block in `compare`). Groups seen at least twice
//!   are dealt, hottest first (request counts over the whole trace), to the
//!   least loaded of `n - t` backends that still has room for the group's
//!   common prefix (first-fit by popularity); every other request goes to one
//!   of the `t` remaining backends (or any backend when `t = 0`), chosen by a
//!   fixed hash of the request. The best of `t` = 0, 1, 2 is reported. It
//!   ignores load (a fixed assignment cannot follow it) and keeps one copy of
//!   each group: **a reference, not a bound**; it is what a router that knew
//!   the popularities, and left the engines' LRU alone, could reach by
//!   pinning.
//!
//! Both cache whole items (a block, or a document of `scale`) and count
//! prefix hits capped as an engine caps them (the last prompt token is
//! recomputed). A request touches its items last first, so its first item is
//! the most recently used (vLLM frees a request's blocks tail first, so its
//! tail is evicted first). Answers of a conversation are not modelled:
//! callers leave conversations out. Fleets above [`MAX_BACKENDS`] get neither
//! (each cold request scans every backend).

use crate::offline::{capped_hit, Fleet, InFlight, OptRequest, NEVER};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The largest fleet the LRU references are computed for.
pub const MAX_BACKENDS: usize = 64;

/// One backend's LRU cache of whole items, capacity in blocks.
#[derive(Debug, Default)]
struct Lru {
    capacity: u64,
    used: u64,
    tick: u64,
    /// (last use, item), least recent first.
    order: BTreeSet<(u64, u64)>,
    /// Resident items: (last use, size, next use in the trace).
    resident: HashMap<u64, (u64, u32, usize)>,
}

impl Lru {
    fn new(capacity: u64) -> Self {
        Lru {
            capacity,
            ..Lru::default()
        }
    }

    /// Blocks of the longest prefix of `items` held.
    fn prefix_blocks(&self, items: &[(u64, u32)]) -> u64 {
        items
            .iter()
            .take_while(|(id, _)| self.resident.contains_key(id))
            .map(|&(_, s)| u64::from(s))
            .sum()
    }

    /// The next use of the soonest-needed item that writing `items` here
    /// would evict ([`NEVER`] when it fits, or evicts only what is never
    /// used again). `mine`: the ids of `items`, which are never victims.
    fn loss(&self, items: &[(u64, u32)], mine: &HashSet<u64>) -> usize {
        let need: u64 = items
            .iter()
            .filter(|(id, s)| !self.resident.contains_key(id) && u64::from(*s) <= self.capacity)
            .map(|&(_, s)| u64::from(s))
            .sum();
        let mut free = self.capacity.saturating_sub(self.used);
        let mut soonest = NEVER;
        for &(_, v) in &self.order {
            if free >= need {
                break;
            }
            if mine.contains(&v) {
                continue;
            }
            if let Some(&(_, size, next)) = self.resident.get(&v) {
                free += u64::from(size);
                soonest = soonest.min(next);
            }
        }
        soonest
    }

    /// Stores a request's `items` (next used at `next[k]`, when known):
    /// each becomes recently used, the first most; missing ones evict the
    /// least recently used items of other requests until they fit (an item
    /// that cannot fit is not cached).
    fn access(&mut self, items: &[(u64, u32)], next: Option<&[usize]>) {
        let len = items.len() as u64;
        self.tick += len + 1;
        let base = self.tick;
        // Ticks of this request are above `floor`: never evict those.
        let floor = base - len;
        for (k, &(id, size)) in items.iter().enumerate() {
            let at = base - k as u64;
            let nx = next.and_then(|n| n.get(k).copied()).unwrap_or(NEVER);
            if let Some(e) = self.resident.get_mut(&id) {
                self.order.remove(&(e.0, id));
                *e = (at, e.1, nx);
                self.order.insert((at, id));
                continue;
            }
            let size64 = u64::from(size);
            while self.used + size64 > self.capacity {
                let Some(&(t, v)) = self.order.first() else {
                    break;
                };
                if t > floor {
                    break;
                }
                self.order.remove(&(t, v));
                if let Some((_, s, _)) = self.resident.remove(&v) {
                    self.used -= u64::from(s);
                }
            }
            if self.used + size64 <= self.capacity {
                self.used += size64;
                self.resident.insert(id, (at, size, nx));
                self.order.insert((at, id));
            }
        }
    }
}

/// Tokens hit by the oracle router on LRU engines (see the module docs).
pub(crate) fn oracle_hits(trace: &[OptRequest], next: &[Vec<usize>], fleet: Fleet) -> u64 {
    let n = fleet.backends;
    let mut caches: Vec<Lru> = (0..n).map(|_| Lru::new(fleet.cache_blocks)).collect();
    let mut load = InFlight::new(fleet);
    let mut hits = 0;
    for (r, req) in trace.iter().enumerate() {
        load.advance(req.arrival);
        let room: Vec<usize> = (0..n).filter(|&b| load.room(b)).collect();
        let warm = room
            .iter()
            .map(|&b| (caches[b].prefix_blocks(&req.items), b))
            .filter(|&(blocks, _)| blocks > 0)
            .max_by_key(|&(blocks, b)| {
                (blocks, std::cmp::Reverse(load.of(b)), std::cmp::Reverse(b))
            });
        let (blocks, b) = match warm {
            Some(w) => w,
            None => {
                let mine: HashSet<u64> = req.items.iter().map(|i| i.0).collect();
                let b = room
                    .iter()
                    .copied()
                    .max_by_key(|&b| {
                        let loss = caches[b].loss(&req.items, &mine);
                        (loss, std::cmp::Reverse(load.of(b)), std::cmp::Reverse(b))
                    })
                    .unwrap_or(0);
                (0, b)
            }
        };
        hits += capped_hit(blocks, req, fleet);
        caches[b].access(&req.items, next.get(r).map(Vec::as_slice));
        load.start(b, req.done.max(req.arrival));
    }
    hits
}

/// A prefix group: its requests and the items all of them start with.
struct Group {
    count: u64,
    common: Vec<(u64, u32)>,
}

/// Tokens hit by the best static pinned set on LRU engines, over 0, 1 and 2
/// tail backends (see the module docs).
pub(crate) fn pinned_hits(trace: &[OptRequest], fleet: Fleet) -> u64 {
    let n = fleet.backends;
    let mut groups: HashMap<u64, Group> = HashMap::new();
    for req in trace {
        let Some(&(first, _)) = req.items.first() else {
            continue;
        };
        let g = groups.entry(first).or_insert_with(|| Group {
            count: 0,
            common: req.items.clone(),
        });
        g.count += 1;
        let same = g
            .common
            .iter()
            .zip(&req.items)
            .take_while(|(a, b)| a == b)
            .count();
        g.common.truncate(same);
    }
    let mut hot: Vec<(u64, u64, u64)> = groups
        .iter()
        .filter(|(_, g)| g.count >= 2)
        .map(|(&id, g)| {
            (
                g.count,
                id,
                g.common.iter().map(|&(_, s)| u64::from(s)).sum(),
            )
        })
        .collect();
    hot.sort_by_key(|&(count, id, _)| (std::cmp::Reverse(count), id));
    (0..=2.min(n.saturating_sub(1)))
        .map(|tails| pinned_with(trace, fleet, &hot, tails))
        .max()
        .unwrap_or(0)
}

/// [`pinned_hits`] with `tails` backends for the unpinned requests; `hot`:
/// (requests, first item, common blocks) of the groups, hottest first.
fn pinned_with(trace: &[OptRequest], fleet: Fleet, hot: &[(u64, u64, u64)], tails: usize) -> u64 {
    let n = fleet.backends;
    let pinned = n - tails;
    let mut load = vec![0u64; pinned];
    let mut used = vec![0u64; pinned];
    let mut home: HashMap<u64, usize> = HashMap::new();
    for &(count, id, blocks) in hot {
        let fits = (0..pinned)
            .filter(|&b| used[b] + blocks <= fleet.cache_blocks)
            .min_by_key(|&b| (load[b], b));
        if let Some(b) = fits {
            load[b] += count;
            used[b] += blocks;
            home.insert(id, b);
        }
    }
    let mut caches: Vec<Lru> = (0..n).map(|_| Lru::new(fleet.cache_blocks)).collect();
    let mut hits = 0;
    for (r, req) in trace.iter().enumerate() {
        let Some(&(first, _)) = req.items.first() else {
            continue;
        };
        let b = home.get(&first).copied().unwrap_or_else(|| {
            // A fixed hash of the request spreads the rest evenly.
            let h = (r as u64 ^ 0x0005_DEEC_E66D).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33;
            if tails == 0 {
                h as usize % n
            } else {
                pinned + h as usize % tails
            }
        });
        hits += capped_hit(caches[b].prefix_blocks(&req.items), req, fleet);
        caches[b].access(&req.items, None);
    }
    hits
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "lru_refs_tests.rs"]
mod tests;
