//! The offline trace model every hit-rate reference shares: the requests,
//! the fleet, the in-flight limit and the engine's cap on a hit.

use std::collections::{BTreeSet, BinaryHeap};

#[derive(Clone, Debug, PartialEq)]
pub struct OptRequest {
    /// Arrival, seconds.
    pub arrival: f64,
    /// Completion, seconds (for the in-flight limit of [`Optimum::reference`](crate::optimum::Optimum)).
    pub done: f64,
    /// The prompt's cacheable content in order: (item id, size in blocks).
    pub items: Vec<(u64, u32)>,
    /// Prompt tokens (the denominator of the hit rate).
    pub prompt_tokens: u64,
}

/// The fleet the references assume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fleet {
    pub backends: usize,
    /// Cache capacity of each, in blocks.
    pub cache_blocks: u64,
    pub block_size: u64,
    /// Requests in flight per backend before it counts as full.
    pub max_in_flight: usize,
}

/// Never used again.
pub(crate) const NEVER: usize = usize::MAX;

/// Requests in flight per backend, from arrival to completion, and the
/// in-flight limit every per-backend reference routes under.
pub(crate) struct InFlight {
    in_flight: Vec<usize>,
    by_load: BTreeSet<(usize, usize)>,
    /// (completion time's bits, backend): non-negative floats order as their bits.
    running: BinaryHeap<std::cmp::Reverse<(u64, usize)>>,
    limit: usize,
}

impl InFlight {
    pub(crate) fn new(fleet: Fleet) -> Self {
        let n = fleet.backends;
        InFlight {
            in_flight: vec![0; n],
            by_load: (0..n).map(|b| (0, b)).collect(),
            running: BinaryHeap::new(),
            limit: fleet.max_in_flight.max(1),
        }
    }

    pub(crate) fn advance(&mut self, now: f64) {
        while let Some(std::cmp::Reverse((t, b))) = self.running.peek().copied() {
            if f64::from_bits(t) > now {
                break;
            }
            self.running.pop();
            self.shift(b, false);
        }
    }

    pub(crate) fn of(&self, b: usize) -> usize {
        self.in_flight[b]
    }

    /// Whether `b` may take a request: under the limit, or as loaded as
    /// the least loaded (when every backend is full, the least wait).
    pub(crate) fn room(&self, b: usize) -> bool {
        let least = self.by_load.first().map_or(0, |&(l, _)| l);
        self.in_flight[b] < self.limit || self.in_flight[b] == least
    }

    pub(crate) fn start(&mut self, b: usize, done: f64) {
        self.shift(b, true);
        // `+ 0.0` turns -0.0 into 0.0.
        let done = (done.max(0.0) + 0.0).to_bits();
        self.running.push(std::cmp::Reverse((done, b)));
    }

    fn shift(&mut self, b: usize, up: bool) {
        self.by_load.remove(&(self.in_flight[b], b));
        if up {
            self.in_flight[b] += 1;
        } else {
            self.in_flight[b] -= 1;
        }
        self.by_load.insert((self.in_flight[b], b));
    }
}

/// Tokens a hit of `blocks` blocks saves `req`: the engine recomputes at
/// least the last prompt token, so at most the full blocks before it.
pub(crate) fn capped_hit(blocks: u64, req: &OptRequest, fleet: Fleet) -> u64 {
    let bs = fleet.block_size.max(1);
    let cap = req.prompt_tokens.saturating_sub(1) / bs * bs;
    (blocks * bs).min(cap)
}

/// Tiny traces for the references' unit tests.
#[cfg(test)]
pub(crate) mod test_trace {
    use super::{Fleet, OptRequest};
    use proptest::prelude::*;

    /// A request at `t` (instant: never in flight) over unit items.
    pub(crate) fn req(t: f64, items: &[u64]) -> OptRequest {
        OptRequest {
            arrival: t,
            done: t,
            items: items.iter().map(|&i| (i, 1)).collect(),
            // One token more than the blocks: the engine cap never bites.
            prompt_tokens: items.len() as u64 + 1,
        }
    }

    /// A fleet of unit blocks and a generous in-flight limit.
    pub(crate) fn fleet(backends: usize, cache_blocks: u64) -> Fleet {
        Fleet {
            backends,
            cache_blocks,
            block_size: 1,
            max_in_flight: 64,
        }
    }

    /// Random small traces: shared documents, some with a unique tail.
    pub(crate) fn arb_trace() -> impl Strategy<Value = Vec<OptRequest>> {
        // Documents 0..4 with chains of 1..5 blocks, some with a unique tail.
        prop::collection::vec((0u64..4, 1usize..5, any::<bool>()), 1..14).prop_map(|spec| {
            spec.iter()
                .enumerate()
                .map(|(i, &(d, len, tail))| {
                    let mut items: Vec<u64> = (0..len as u64).map(|k| d * 100 + k).collect();
                    if tail {
                        items.push(1_000 + i as u64);
                    }
                    req(i as f64, &items)
                })
                .collect()
        })
    }
}
