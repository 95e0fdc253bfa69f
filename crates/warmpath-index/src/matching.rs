//! `longest_match`: one walk down a request's block chain that tells, per worker,
//! how many leading blocks it holds (a match ends at the first missing block, as
//! the engine's own lookup does). Past the first `HEAD` blocks it probes in
//! batches under one read lock per shard, taken in ascending shard order so two
//! walks never wait on each other in a cycle; prefetches are hints only. The
//! result is exactly the block-by-block walk's (`walk_tests.rs`); the whys are in
//! docs/cache-index.md.

use super::holders::{Holder, Holders, WorkerSlot};
use super::table::CacheIndex;
use super::tier::Tier;
use serde::Serialize;
use warmpath_hash::BlockHash;

/// How far one worker matches a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerMatch {
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
}

/// Blocks walked one `DashMap::get` at a time before chunked probing: a
/// short match locks no more shards than it reads.
const HEAD: usize = 8;
/// Chunk `k` of the rest of the chain ends at `HEAD x GROWTH^k`.
const GROWTH: usize = 8;
/// Blocks probed back to back before their holders are taken.
const PROBE: usize = 16;
/// Up to this many workers still matching, each is looked up among a
/// block's holders; more take one marking pass over the holders.
const FEW: usize = 4;
/// Batches whose last blocks a skipping walk probes back to back.
const AHEAD: usize = 16;

struct Active {
    slot: WorkerSlot,
    gen: u8,
    fresh: bool,
    gpu_blocks: u32,
    gpu_contiguous: bool,
    /// Prefix-closed at the walk's start, at this version.
    closed: Option<u64>,
}

/// The workers still matching, and those whose match ended.
struct Walk {
    active: Vec<Active>,
    /// Slot -> its place in `active` (only the first block's holders can
    /// ever be active).
    at: Vec<u32>,
    /// Per place: the depth it was last seen at, with its tiers there.
    mark: Vec<(u32, u8)>,
    /// The spilled holders the marking pass last read, those of every block
    /// from there to depth `prev_at` (`u32::MAX` before any).
    prev: Vec<Holder>,
    prev_at: u32,
    out: MatchResult,
    /// Whether runs may be skipped (false when the walk is redone).
    may_skip: bool,
    /// The workers a run was skipped for, with their starting versions.
    skipped: Vec<(WorkerSlot, u64)>,
}

impl Walk {
    fn new(active: Vec<Active>, chain_len: u32, may_skip: bool) -> Self {
        let top = active
            .iter()
            .map(|a| a.slot as usize + 1)
            .max()
            .unwrap_or(0);
        let mut at = vec![u32::MAX; top];
        for (k, a) in active.iter().enumerate() {
            at[a.slot as usize] = k as u32;
        }
        Walk {
            mark: vec![(0, 0); active.len()],
            prev: Vec::new(),
            prev_at: u32::MAX,
            active,
            at,
            out: MatchResult {
                chain_len,
                ..MatchResult::default()
            },
            may_skip,
            skipped: Vec::new(),
        }
    }

    fn done(&self) -> bool {
        self.active.is_empty()
    }

    /// Whether every worker still matching is prefix-closed.
    fn can_skip(&self) -> bool {
        self.may_skip && !self.active.is_empty() && self.active.iter().all(|a| a.closed.is_some())
    }

    /// A run of `len` blocks whose last block has holders `e`: when every
    /// worker still matching holds it on the GPU, closure says each holds
    /// the whole run, and all move past it; else nothing changes and the
    /// run must be walked block by block.
    fn skip(&mut self, len: u32, e: Option<&Holders>) -> bool {
        let Some(e) = e else {
            return false;
        };
        let gpu = Tier::Gpu.bit();
        let all = if self.active.len() <= FEW {
            self.active.iter().all(|a| {
                e.find(a.slot)
                    .is_some_and(|x| x.gen() == a.gen && x.tiers() & gpu != 0)
            })
        } else {
            // One pass over the holders (a hot prefix's copies): count
            // those that are workers still matching, at their generation.
            let mut n = 0;
            for x in e.iter() {
                let k = self.at.get(x.slot() as usize).copied().unwrap_or(u32::MAX);
                if let Some(a) = self.active.get(k as usize) {
                    if a.slot == x.slot() && a.gen == x.gen() && x.tiers() & gpu != 0 {
                        n += 1;
                    }
                }
            }
            n == self.active.len()
        };
        if !all {
            return false;
        }
        // The workers still matching only ever shrink: those of the first
        // skip are all a later one can have.
        if self.skipped.is_empty() {
            self.skipped
                .extend(self.active.iter().filter_map(|a| Some((a.slot, a.closed?))));
        }
        for a in &mut self.active {
            if a.gpu_contiguous {
                a.gpu_blocks += len;
            }
        }
        true
    }

    fn finish(out: &mut MatchResult, a: &Active, depth: u32) {
        out.workers.push(WorkerMatch {
            slot: a.slot,
            blocks: depth,
            gpu_blocks: a.gpu_blocks,
            fresh: a.fresh,
        });
    }

    /// Block `depth` of the chain has holders `e` (`None`: not indexed).
    fn step(&mut self, depth: u32, e: Option<&Holders>) {
        let Some(e) = e else {
            for a in &self.active {
                Self::finish(&mut self.out, a, depth);
            }
            self.active.clear();
            return;
        };
        if self.active.len() <= FEW {
            // Few still matching (the common case): each is looked up among
            // the holders directly.
            let out = &mut self.out;
            let before = self.active.len();
            self.active.retain_mut(|a| match e.find(a.slot) {
                Some(x) if x.gen() == a.gen => {
                    if a.gpu_contiguous && x.tiers() & Tier::Gpu.bit() != 0 {
                        a.gpu_blocks += 1;
                    } else {
                        a.gpu_contiguous = false;
                    }
                    true
                }
                _ => {
                    Self::finish(out, a, depth);
                    false
                }
            });
            if self.active.len() != before {
                self.reindex();
            }
            return;
        }
        // Many, and the same holders, tiers included, as the block before
        // (a hot prefix's copies hold all of it): every worker still
        // matching holds this block on the tiers it held the last one on,
        // so each matches on, and a GPU run still unbroken grows by one.
        let spilled = e.spilled();
        if let Some(hs) = spilled {
            if self.prev_at.wrapping_add(1) == depth && hs == self.prev.as_slice() {
                for a in &mut self.active {
                    if a.gpu_contiguous {
                        a.gpu_blocks += 1;
                    }
                }
                self.prev_at = depth;
                return;
            }
        }
        // Else one pass over the block's holders marks the active workers
        // that hold it (their current generation), so a block costs
        // O(holders + active), not their product.
        if let Some(hs) = spilled {
            self.prev.clear();
            self.prev.extend_from_slice(hs);
            self.prev_at = depth;
        }
        for x in e.iter() {
            if let Some(&k) = self.at.get(x.slot() as usize) {
                if let Some(a) = self.active.get(k as usize) {
                    if a.slot == x.slot() && a.gen == x.gen() {
                        self.mark[k as usize] = (depth, x.tiers());
                    }
                }
            }
        }
        let (mark, out) = (&self.mark, &mut self.out);
        let mut k = 0;
        self.active.retain_mut(|a| {
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
                Self::finish(out, a, depth);
                false
            }
        });
        self.reindex();
    }

    /// Survivors moved down: their slots point at their new places (a stale
    /// mark is of an earlier depth: it never counts).
    fn reindex(&mut self) {
        for (k, a) in self.active.iter().enumerate() {
            self.at[a.slot as usize] = k as u32;
        }
    }

    fn end(mut self, chain_len: u32) -> (MatchResult, Vec<(WorkerSlot, u64)>) {
        for a in &self.active {
            Self::finish(&mut self.out, a, chain_len);
        }
        self.out.workers.sort_unstable_by_key(|m| m.slot);
        (self.out, self.skipped)
    }
}

impl CacheIndex {
    /// Walks `hashes` (a request's chain, block 0 first) once and returns, per
    /// worker, how many leading blocks it holds.
    pub fn longest_match(&self, hashes: &[BlockHash]) -> MatchResult {
        let (out, skipped) = self.walk_chain(hashes, true);
        #[cfg(test)]
        self.after_walk();
        // A skip is exact only if the worker stayed closed (closure docs).
        if self.unchanged_since(&skipped) {
            return out;
        }
        self.walk_chain(hashes, false).0
    }

    fn walk_chain(
        &self,
        hashes: &[BlockHash],
        may_skip: bool,
    ) -> (MatchResult, Vec<(WorkerSlot, u64)>) {
        let len = hashes.len() as u32;
        let Some(first) = hashes.first() else {
            return (MatchResult::default(), Vec::new());
        };
        // The holders are copied out first: the worker table is read with
        // no shard lock held.
        let holders: Vec<Holder> = self
            .map
            .get(&first.0)
            .map(|e| e.iter().collect())
            .unwrap_or_default();
        let state = self.workers.routing_state(holders.iter().map(|h| h.slot()));
        let active: Vec<Active> = holders
            .iter()
            .zip(state)
            .filter_map(|(h, st)| {
                let st = st?;
                (st.gen == h.gen()).then(|| {
                    let gpu = h.tiers() & Tier::Gpu.bit() != 0;
                    Active {
                        slot: h.slot(),
                        gen: st.gen,
                        fresh: st.fresh,
                        gpu_blocks: u32::from(gpu),
                        gpu_contiguous: gpu,
                        closed: st.closed_at,
                    }
                })
            })
            .collect();
        let mut walk = Walk::new(active, len, may_skip);
        // A walk that may skip from the first block on goes to the chunks at
        // once: there the head's blocks are passed with back-to-back probes
        // of batch ends, not probed one after another.
        let head = if walk.can_skip() {
            1
        } else {
            hashes.len().min(HEAD)
        };
        for (i, h) in hashes.iter().enumerate().take(head).skip(1) {
            if walk.done() {
                break;
            }
            let e = self.map.get(&h.0);
            walk.step(i as u32, e.as_deref());
        }
        let mut lo = head;
        let mut hi = HEAD * GROWTH;
        while lo < hashes.len() && !walk.done() {
            let end = hi.min(hashes.len());
            self.walk_chunk(&hashes[lo..end], lo, &mut walk);
            (lo, hi) = (end, hi.saturating_mul(GROWTH));
        }
        walk.end(len)
    }

    /// Walks `chunk`, the blocks of the chain from depth `lo` on, with each
    /// shard it needs read-locked once (module docs).
    fn walk_chunk(&self, chunk: &[BlockHash], lo: usize, walk: &mut Walk) {
        let shards = self.map.shards();
        let keys: Vec<(u64, usize)> = chunk
            .iter()
            .map(|h| {
                let hash = self.map.hash_usize(&h.0);
                (hash as u64, self.map.determine_shard(hash))
            })
            .collect();
        let mut need = vec![false; shards.len()];
        for &(_, s) in &keys {
            need[s] = true;
        }
        // Ascending shard order: see the module docs.
        let guards: Vec<Option<_>> = (need.iter().enumerate())
            .map(|(s, &n)| n.then(|| shards[s].read()))
            .collect();
        // Each batch's slots are asked for while the batch before it is
        // probed (module docs).
        let hint = |c: usize| {
            for &(hash, s) in keys.iter().skip(c * PROBE).take(PROBE) {
                if let Some(g) = guards[s].as_ref() {
                    let pos = hash as usize & (g.buckets() - 1);
                    let end = g.data_end().as_ptr();
                    prefetch(end.cast::<u8>().wrapping_add(pos));
                    // A slot may straddle two lines: both ends.
                    prefetch(end.wrapping_sub(pos + 1).cast::<u8>());
                    prefetch(end.wrapping_sub(pos).cast::<u8>().wrapping_sub(1));
                }
            }
        };
        let probe = |i: usize| {
            let (hash, s) = keys[i];
            guards[s]
                .as_ref()
                .and_then(|g| g.get(hash, |(k, _)| *k == chunk[i].0))
                .map(|(_, v)| v.get())
        };
        let batches = chunk.len().div_ceil(PROBE);
        let last_of = |b: usize| ((b + 1) * PROBE).min(chunk.len()) - 1;
        let mut c = 0;
        let mut hinted = false;
        while c < batches {
            if walk.done() {
                return;
            }
            if walk.can_skip() {
                // The last blocks of the next batches, probed back to back.
                let (start, upto) = (c, (c + AHEAD).min(batches));
                let mut ends: [Option<&Holders>; AHEAD] = [None; AHEAD];
                for b in start..upto {
                    ends[b - start] = probe(last_of(b));
                }
                while c < upto && walk.skip((last_of(c) + 1 - c * PROBE) as u32, ends[c - start]) {
                    c += 1;
                }
                if c == upto {
                    continue;
                }
            } else if !hinted {
                hint(c);
            }
            // Batch `c`, block by block, with the next one's slots asked for.
            hint(c + 1);
            hinted = true;
            let lo_c = c * PROBE;
            let hi_c = last_of(c) + 1;
            let mut found: [Option<&Holders>; PROBE] = [None; PROBE];
            for i in lo_c..hi_c {
                found[i - lo_c] = probe(i);
            }
            for (j, e) in found.iter().take(hi_c - lo_c).enumerate() {
                if walk.done() {
                    return;
                }
                walk.step((lo + lo_c + j) as u32, *e);
            }
            c += 1;
        }
    }
}

/// Asks the CPU to start loading the cache line at `p`: a hint with no
/// effect on memory or on what the program computes, so any address is
/// fine (a prefetch never faults).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` reads nothing architecturally and cannot fault;
    // SSE is part of every x86_64 target.
    #[allow(unsafe_code)]
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
