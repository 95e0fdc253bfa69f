//! Offline Belady references for the hit rate: what a router that knew the
//! whole trace and every backend's capacity could reach. Why
//! [`Optimum::bound`] is an upper bound, and what each reference assumes:
//! docs/bench.md, "Hit-rate references".

use crate::offline::NEVER;
pub use crate::offline::{Fleet, OptRequest};
use std::collections::{BTreeSet, HashMap};

/// The references of one trace (hit rates, 0..=1).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Optimum {
    /// Pooled fleet cache, Belady's rule: an upper bound on any router.
    pub bound: f64,
    /// Per-backend LRU caches, a greedy router that knows the trace ([`crate::lru_refs`]).
    pub lru_oracle: Option<f64>,
}

/// What the hit-rate references assume: the line under every report's table.
pub const LEGEND: &str = "Hit-rate references, offline over this run's trace: \
ceiling = every repeat of a prefix hits (unlimited caches); \
bound = one pooled cache of the fleet's blocks evicting by Belady's rule, an upper bound on any router \
(engines that evict LRU cannot reach it); \
LRU oracle = per-backend LRU caches (as vLLM evicts), a greedy router that knows the whole trace, \
a reference, not a bound: the target.";

/// The references of `trace` on `fleet`; `None` for an empty trace.
pub fn optimum(trace: &[OptRequest], fleet: Fleet) -> Option<Optimum> {
    let prompt: u64 = trace.iter().map(|r| r.prompt_tokens).sum();
    if prompt == 0 || fleet.backends == 0 {
        return None;
    }
    let next = next_uses(trace);
    let bs = fleet.block_size.max(1);
    let bound = pooled_hits(trace, &next, fleet.backends as u64 * fleet.cache_blocks) * bs;
    let rate = |hits: u64| hits as f64 / prompt as f64;
    let lru = crate::lru_refs::lru_hits(trace, &next, fleet);
    Some(Optimum {
        bound: rate(bound).min(1.0),
        lru_oracle: lru.map(rate),
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
        if let Some(v) = o.lru_oracle {
            parts.push(format!("LRU oracle {:.1}%", 100.0 * v));
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "optimum_tests.rs"]
mod tests;
