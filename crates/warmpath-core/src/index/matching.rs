//! `longest_match`: one walk down a request's block chain that tells, per
//! worker, how many leading blocks it holds.
//!
//! A worker's match ends at its first missing block, exactly as an engine's own
//! prefix lookup ends there: blocks it holds further down the chain cannot be
//! used and do not count. The walk stops as soon as no worker is still
//! matching, so a cold request costs one map lookup.

use super::holders::WorkerSlot;
use super::{CacheIndex, Tier};
use crate::hash::BlockHash;
use serde::Serialize;

/// How far one worker matches a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerMatch {
    /// The worker's slot in the index.
    pub slot: WorkerSlot,
    /// Leading blocks held on any tier.
    pub blocks: u32,
    /// Leading blocks held on the GPU tier (`<= blocks`).
    pub gpu_blocks: u32,
    /// False when the worker is stale: its entries should not count.
    pub fresh: bool,
}

/// The per-worker matches of one chain; workers matching no block are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MatchResult {
    /// One entry per worker holding at least the first block.
    pub workers: Vec<WorkerMatch>,
    /// Length of the chain that was matched.
    pub chain_len: u32,
}

impl MatchResult {
    /// The match of `slot`, if any.
    pub fn of(&self, slot: WorkerSlot) -> Option<&WorkerMatch> {
        self.workers.iter().find(|m| m.slot == slot)
    }

    /// The deepest match among fresh workers (0 when none).
    pub fn best_fresh(&self) -> u32 {
        self.workers
            .iter()
            .filter(|m| m.fresh)
            .map(|m| m.blocks)
            .max()
            .unwrap_or(0)
    }
}

struct Active {
    slot: WorkerSlot,
    gen: u8,
    fresh: bool,
    gpu_blocks: u32,
    gpu_contiguous: bool,
}

impl CacheIndex {
    /// Walks `hashes` (a request's chain, block 0 first) once and returns, per
    /// worker, how many leading blocks it holds.
    pub fn longest_match(&self, hashes: &[BlockHash]) -> MatchResult {
        let mut out = MatchResult {
            workers: Vec::new(),
            chain_len: hashes.len() as u32,
        };
        let Some(first) = hashes.first() else {
            return out;
        };
        let view = self.workers.routing_view();
        let mut active: Vec<Active> = match self.map.get(&first.0) {
            None => return out,
            Some(e) => e
                .iter()
                .filter_map(|h| {
                    let (gen, fresh) = (*view.get(h.slot() as usize)?)?;
                    (gen == h.gen()).then(|| {
                        let gpu = h.tiers() & Tier::Gpu.bit() != 0;
                        Active {
                            slot: h.slot(),
                            gen,
                            fresh,
                            gpu_blocks: u32::from(gpu),
                            gpu_contiguous: gpu,
                        }
                    })
                })
                .collect(),
        };
        // Slot -> its place in `active` (only the first block's holders
        // can ever be active), and per place the depth it was last seen at.
        let top = active
            .iter()
            .map(|a| a.slot as usize + 1)
            .max()
            .unwrap_or(0);
        let mut at = vec![u32::MAX; top];
        for (k, a) in active.iter().enumerate() {
            at[a.slot as usize] = k as u32;
        }
        let mut mark: Vec<(u32, u8)> = vec![(0, 0); active.len()];
        let finish = |a: &Active, depth: u32, out: &mut MatchResult| {
            out.workers.push(WorkerMatch {
                slot: a.slot,
                blocks: depth,
                gpu_blocks: a.gpu_blocks,
                fresh: a.fresh,
            });
        };
        for (i, h) in hashes.iter().enumerate().skip(1) {
            if active.is_empty() {
                break;
            }
            let depth = i as u32;
            match self.map.get(&h.0) {
                None => {
                    for a in &active {
                        finish(a, depth, &mut out);
                    }
                    active.clear();
                }
                Some(e) => {
                    // One pass over the block's holders marks the active
                    // workers that hold it (their current generation), so
                    // a block costs O(holders + active), not their product.
                    for x in e.iter() {
                        if let Some(&k) = at.get(x.slot() as usize) {
                            if let Some(a) = active.get(k as usize) {
                                if a.slot == x.slot() && a.gen == x.gen() {
                                    mark[k as usize] = (depth, x.tiers());
                                }
                            }
                        }
                    }
                    let mut k = 0;
                    active.retain_mut(|a| {
                        let (seen, tiers) = mark[k];
                        k += 1;
                        if seen == depth {
                            if a.gpu_contiguous && tiers & Tier::Gpu.bit() != 0 {
                                a.gpu_blocks += 1;
                            } else {
                                a.gpu_contiguous = false;
                            }
                            true
                        } else {
                            finish(a, depth, &mut out);
                            false
                        }
                    });
                    // Survivors moved down: their slots point at new places
                    // (a stale mark is of an earlier depth: it never counts).
                    for (k, a) in active.iter().enumerate() {
                        at[a.slot as usize] = k as u32;
                    }
                }
            }
        }
        for a in &active {
            finish(a, hashes.len() as u32, &mut out);
        }
        out.workers.sort_unstable_by_key(|m| m.slot);
        out
    }
}
