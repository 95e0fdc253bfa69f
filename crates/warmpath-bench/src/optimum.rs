//! Offline Belady references for the hit rate: what a router that knew the
//! whole trace and every backend's capacity could reach. Why
//! [`Optimum::bound`] is an upper bound, and what each reference assumes:
//! docs/bench.md, "Hit-rate references".

use crate::offline::{capped_hit, InFlight, NEVER};
pub use crate::offline::{Fleet, OptRequest};
use std::collections::{BTreeSet, HashMap};

/// The references of one trace (hit rates, 0..=1).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Optimum {
    /// Pooled fleet cache, Belady's rule: an upper bound on any router.
    pub bound: f64,
    /// Per-backend caches, Belady's rule, greedy routing: a reference.
    pub reference: f64,
    /// Per-backend LRU caches, a greedy router that knows the trace ([`crate::lru_refs`]).
    pub lru_oracle: Option<f64>,
    /// Per-backend LRU caches, the best pinned set ([`crate::lru_refs`]).
    pub lru_pinned: Option<f64>,
}

/// What the hit-rate references assume: the line under every report's table.
pub const LEGEND: &str = "Hit-rate references, offline over this run's trace: \
ceiling = every repeat of a prefix hits (unlimited caches); \
bound = one pooled cache of the fleet's blocks evicting by Belady's rule, an upper bound on any router \
(engines that evict LRU cannot reach it); \
reference = per-backend caches evicting by Belady's rule, greedy warmest-backend routing under the in-flight limit, \
a reference, not a bound; \
LRU oracle = per-backend LRU caches (as vLLM evicts), a greedy router that knows the whole trace, \
a reference, not a bound; \
LRU pinned = per-backend LRU caches, the best fixed assignment of prefix groups to backends by popularity \
(0-2 backends take the rest), a reference, not a bound.";

/// The references of `trace` on `fleet`; `None` for an empty trace.
pub fn optimum(trace: &[OptRequest], fleet: Fleet) -> Option<Optimum> {
    let prompt: u64 = trace.iter().map(|r| r.prompt_tokens).sum();
    if prompt == 0 || fleet.backends == 0 {
        return None;
    }
    let next = next_uses(trace);
    let bs = fleet.block_size.max(1);
    let bound = pooled_hits(trace, &next, fleet.backends as u64 * fleet.cache_blocks) * bs;
    let reference = reference_hits(trace, &next, fleet);
    let rate = |hits: u64| hits as f64 / prompt as f64;
    let lru = crate::lru_refs::lru_hits(trace, &next, fleet);
    Some(Optimum {
        bound: rate(bound).min(1.0),
        reference: rate(reference),
        lru_oracle: lru.map(|(oracle, _)| rate(oracle)),
        lru_pinned: lru.map(|(_, pinned)| rate(pinned)),
    })
}

/// The references for a trace of `(arrival s, done s, document)` (`scale`):
/// each document one item of `doc_blocks` blocks (the never-shared question
/// tail left out).
pub fn of_documents(
    docs: impl Iterator<Item = (f64, f64, u64)>,
    doc_blocks: u32,
    prompt_tokens: u64,
    fleet: Fleet,
) -> Option<Optimum> {
    let trace: Vec<OptRequest> = docs
        .map(|(arrival, done, doc)| OptRequest {
            arrival,
            done,
            items: if doc_blocks == 0 {
                Vec::new()
            } else {
                vec![(doc, doc_blocks)]
            },
            prompt_tokens,
        })
        .collect();
    optimum(&trace, fleet)
}

/// A hit rate cell: `87.1%`, with the references when known: `87.1%
/// (ceiling 94.3%, bound 90.2%, ...)`.
pub fn cell(hit_rate: f64, ceiling: Option<f64>, optimum: Option<Optimum>) -> String {
    let mut parts = Vec::new();
    if let Some(c) = ceiling {
        parts.push(format!("ceiling {:.1}%", 100.0 * c));
    }
    if let Some(o) = optimum {
        parts.push(format!("bound {:.1}%", 100.0 * o.bound));
        parts.push(format!("reference {:.1}%", 100.0 * o.reference));
        if let Some(v) = o.lru_oracle {
            parts.push(format!("LRU oracle {:.1}%", 100.0 * v));
        }
        if let Some(v) = o.lru_pinned {
            parts.push(format!("LRU pinned {:.1}%", 100.0 * v));
        }
    }
    if parts.is_empty() {
        format!("{:.1}%", 100.0 * hit_rate)
    } else {
        format!("{:.1}% ({})", 100.0 * hit_rate, parts.join(", "))
    }
}

/// For every request and item, the index of the next request using the item.
pub(crate) fn next_uses(trace: &[OptRequest]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut next = vec![Vec::new(); trace.len()];
    for (r, req) in trace.iter().enumerate().rev() {
        next[r] = req
            .items
            .iter()
            .map(|&(id, _)| seen.insert(id, r).unwrap_or(NEVER))
            .collect();
    }
    next
}

/// A cache filled by Belady's rule with bypass.
#[derive(Debug, Default)]
struct Belady {
    capacity: u64,
    used: u64,
    /// (next use, item) of every resident item.
    by_next: BTreeSet<(usize, u64)>,
    /// Resident items: (next use, size).
    resident: HashMap<u64, (usize, u32)>,
}

impl Belady {
    fn new(capacity: u64) -> Self {
        Belady {
            capacity,
            ..Belady::default()
        }
    }

    fn holds(&self, id: u64) -> bool {
        self.resident.contains_key(&id)
    }

    /// Accesses `id` (next used at `next`); returns the items evicted to make
    /// room, and whether `id` is resident afterwards.
    fn access(&mut self, id: u64, size: u32, next: usize, evicted: &mut Vec<u64>) -> bool {
        if let Some(&(old, sz)) = self.resident.get(&id) {
            self.by_next.remove(&(old, id));
            if next == NEVER {
                self.resident.remove(&id);
                self.used -= u64::from(sz);
                evicted.push(id);
                return false;
            }
            self.by_next.insert((next, id));
            self.resident.insert(id, (next, sz));
            return true;
        }
        let size64 = u64::from(size);
        if next == NEVER || size64 > self.capacity {
            return false;
        }
        // Evict only items used later than this one; else bypass it.
        let mut victims = Vec::new();
        let mut free = self.capacity - self.used;
        for &(n, v) in self.by_next.iter().rev() {
            if free >= size64 {
                break;
            }
            if n <= next {
                return false;
            }
            victims.push((n, v));
            free += u64::from(self.resident.get(&v).map_or(0, |e| e.1));
        }
        if free < size64 {
            return false;
        }
        for (n, v) in victims {
            self.by_next.remove(&(n, v));
            if let Some((_, sz)) = self.resident.remove(&v) {
                self.used -= u64::from(sz);
            }
            evicted.push(v);
        }
        self.by_next.insert((next, id));
        self.resident.insert(id, (next, size));
        self.used += size64;
        true
    }
}

/// Blocks hit in one pooled cache of `capacity` blocks (any resident item).
fn pooled_hits(trace: &[OptRequest], next: &[Vec<usize>], capacity: u64) -> u64 {
    // Whole items only: round the capacity up to whole items of the largest
    // size, so that the rounding can only raise the bound.
    let largest = trace
        .iter()
        .flat_map(|r| r.items.iter().map(|i| u64::from(i.1)))
        .max()
        .unwrap_or(1)
        .max(1);
    let mut cache = Belady::new(capacity.div_ceil(largest) * largest);
    let mut evicted = Vec::new();
    let mut hits = 0;
    for (r, req) in trace.iter().enumerate() {
        for (k, &(id, size)) in req.items.iter().enumerate() {
            if cache.holds(id) {
                hits += u64::from(size);
            }
            cache.access(id, size, next[r][k], &mut evicted);
        }
    }
    hits
}

/// Tokens hit by the per-backend reference (prefix hits, engine-capped).
fn reference_hits(trace: &[OptRequest], next: &[Vec<usize>], fleet: Fleet) -> u64 {
    let n = fleet.backends;
    let mut caches: Vec<Belady> = (0..n).map(|_| Belady::new(fleet.cache_blocks)).collect();
    // Which backends hold each item.
    let mut holders: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut load = InFlight::new(fleet);
    let mut evicted = Vec::new();
    let mut hits = 0u64;
    for (r, req) in trace.iter().enumerate() {
        load.advance(req.arrival);
        // The warmest backend with room; cold (or tied at 0) goes to the least loaded.
        let mut best: Option<(u64, usize)> = None; // (blocks, backend)
        if let Some(&(first, _)) = req.items.first() {
            for &b in holders.get(&first).map_or(&[][..], Vec::as_slice) {
                let b = b as usize;
                if !load.room(b) {
                    continue;
                }
                let blocks = prefix_blocks(&caches[b], &req.items);
                let better = best.is_none_or(|(bb, bl)| {
                    blocks > bb || (blocks == bb && load.of(b) < load.of(bl))
                });
                if better && blocks > 0 {
                    best = Some((blocks, b));
                }
            }
        }
        let (blocks, b) = match best {
            Some((blocks, b)) => (blocks, b),
            None => (0, cold_pick(&caches, &load, req)),
        };
        hits += capped_hit(blocks, req, fleet);
        for (k, &(id, size)) in req.items.iter().enumerate() {
            let was = caches[b].holds(id);
            let now = caches[b].access(id, size, next[r][k], &mut evicted);
            if now && !was {
                holders.entry(id).or_default().push(b as u32);
            }
        }
        for id in evicted.drain(..) {
            if let Some(h) = holders.get_mut(&id) {
                h.retain(|&x| x as usize != b);
                if h.is_empty() {
                    holders.remove(&id);
                }
            }
        }
        load.start(b, req.done.max(req.arrival));
    }
    hits
}

/// Where a request no backend holds goes: a backend with room where it fits
/// without evicting, else the one whose furthest-used item is used furthest
/// in the future (the least loss), then the least loaded.
fn cold_pick(caches: &[Belady], load: &InFlight, req: &OptRequest) -> usize {
    let need: u64 = req.items.iter().map(|&(_, s)| u64::from(s)).sum();
    let key = |b: usize| {
        let c = &caches[b];
        let fits = c.capacity - c.used >= need;
        let furthest = c.by_next.last().map_or(NEVER, |&(n, _)| n);
        (fits, furthest, std::cmp::Reverse(load.of(b)))
    };
    (0..caches.len())
        .filter(|&b| load.room(b))
        .max_by_key(|&b| (key(b), std::cmp::Reverse(b)))
        .unwrap_or(0)
}

/// Blocks of the longest prefix of `items` that `cache` holds.
fn prefix_blocks(cache: &Belady, items: &[(u64, u32)]) -> u64 {
    items
        .iter()
        .take_while(|(id, _)| cache.holds(*id))
        .map(|&(_, s)| u64::from(s))
        .sum()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "optimum_tests.rs"]
mod tests;
