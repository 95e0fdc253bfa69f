//! One engine rank's block map: vLLM hash -> (warmpath hash, parent, tiers).
//! `BlockStored` tokens are re-hashed chained from the recorded parent (an
//! unknown parent is counted, never guessed); [`Change`]s are emitted only on
//! real transitions, so a replayed batch changes nothing. Removed blocks keep
//! their mapping a while (bounded "ghosts") so a late child still chains.

use std::collections::VecDeque;
use warmpath_core::{hash_block, BlockHash, HashSeed};
use warmpath_proto::v1::Tier;
use warmpath_vllm_events::{BlockStored, EngineBlockHash, KvEvent, KvEventBatch, Medium};

/// The agent's block maps: their keys come from the engine, so each map gets
/// its own random seed (an engine cannot aim keys at one bucket chain).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A change to the set of blocks one rank holds, on warmpath hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Blocks newly held in `tier`; `hashes` is a chain segment after `parent`.
    Stored {
        parent: Option<BlockHash>,
        hashes: Vec<BlockHash>,
        tier: Tier,
    },
    /// Blocks no longer held in `tier`.
    Removed { hashes: Vec<BlockHash>, tier: Tier },
}

/// What applying one batch did, besides the changes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub changes: Vec<Change>,
    /// BlockStored events whose parent is unknown (chain dropped).
    pub unknown_parents: u64,
    /// Offload stores naming a block the tracker never saw with tokens.
    pub unresolved: u64,
    /// Events that contradict themselves (token count vs. hashes, block size 0).
    pub malformed: u64,
    /// Set when this batch taught (or changed) the block size.
    pub block_size_learned: Option<u32>,
    /// New blocks refused at the tracker's bound.
    pub refused: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    wp: BlockHash,
    parent: Option<BlockHash>,
    tiers: u8,
}

fn bit(t: Tier) -> u8 {
    1 << (t as i32 as u8)
}

/// Maps vLLM's medium to a tier (nil/absent: the GPU; unknown strings: disk).
pub fn tier_of(medium: Option<&Medium>) -> Tier {
    match medium {
        None | Some(Medium::Gpu) => Tier::Gpu,
        Some(Medium::Cpu) => Tier::Cpu,
        Some(Medium::Storage) | Some(Medium::Other(_)) => Tier::Disk,
    }
}

/// The block map of one engine rank.
#[derive(Debug)]
pub struct EngineTracker {
    model: String,
    entries: FastMap<EngineBlockHash, Entry>,
    ghosts: VecDeque<EngineBlockHash>,
    ghost_capacity: usize,
    block_size: Option<u32>,
    present: usize,
    max_blocks: usize,
}

/// Blocks one rank may hold (the router's default cap of a worker): an engine
/// holds tens of thousands, so more is a broken or hostile event stream.
pub const MAX_BLOCKS: usize = 1 << 22;

impl EngineTracker {
    /// An empty tracker for `model`, remembering up to `ghost_capacity` removed
    /// blocks' mappings.
    pub fn new(model: impl Into<String>, ghost_capacity: usize) -> Self {
        EngineTracker {
            model: model.into(),
            entries: FastMap::default(),
            ghosts: VecDeque::new(),
            ghost_capacity,
            block_size: None,
            present: 0,
            max_blocks: MAX_BLOCKS,
        }
    }

    /// At most `n` blocks held; new ones beyond are refused (counted).
    #[cfg(test)]
    pub fn with_max_blocks(mut self, n: usize) -> Self {
        self.max_blocks = n;
        self
    }

    /// Blocks held (in at least one tier).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.present
    }

    /// Whether no block is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.present == 0
    }

    pub fn apply_batch(&mut self, batch: &KvEventBatch) -> Outcome {
        let mut out = Outcome::default();
        for e in &batch.events {
            match e {
                KvEvent::BlockStored(s) if s.token_ids.is_empty() => {
                    self.offload_store(s, &mut out)
                }
                KvEvent::BlockStored(s) => self.store(s, &mut out),
                KvEvent::BlockRemoved(r) => {
                    self.remove(&r.block_hashes, tier_of(r.medium.as_ref()), &mut out)
                }
                KvEvent::AllBlocksCleared => out.changes.extend(self.clear()),
            }
        }
        out
    }

    /// Forgets every block (cache reset or engine restart); returns the removals.
    pub fn clear(&mut self) -> Vec<Change> {
        let mut out = Vec::new();
        for tier in [Tier::Gpu, Tier::Cpu, Tier::Disk] {
            let held = self.entries.values().filter(|e| e.tiers & bit(tier) != 0);
            let hashes: Vec<BlockHash> = held.map(|e| e.wp).collect();
            if !hashes.is_empty() {
                out.push(Change::Removed { hashes, tier });
            }
        }
        self.entries.clear();
        self.ghosts.clear();
        self.present = 0;
        out
    }

    fn store(&mut self, s: &BlockStored, out: &mut Outcome) {
        let bs = s.block_size as usize;
        if bs == 0 || s.token_ids.len() != bs * s.block_hashes.len() {
            tracing::warn!(
                tokens = s.token_ids.len(),
                block_size = s.block_size,
                hashes = s.block_hashes.len(),
                "BlockStored whose token count is not block_size x hashes; skipped"
            );
            out.malformed += 1;
            return;
        }
        if self.block_size != Some(s.block_size) {
            if let Some(old) = self.block_size {
                tracing::error!(old, new = s.block_size, "engine block size changed");
            }
            self.block_size = Some(s.block_size);
            out.block_size_learned = Some(s.block_size);
        }
        let (mut prev, parent) = match &s.parent_block_hash {
            Some(p) => match self.entries.get(p) {
                Some(e) => (e.wp.0, Some(e.wp)),
                None => {
                    tracing::debug!(parent = ?p, "BlockStored with an unknown parent; chain dropped");
                    out.unknown_parents += 1;
                    return;
                }
            },
            None => {
                let seed = HashSeed::new(
                    &self.model,
                    s.lora_name.as_deref().unwrap_or(""),
                    s.cache_salt().unwrap_or(""),
                );
                (seed.0, None)
            }
        };
        let tier = tier_of(s.medium.as_ref());
        let mut new = Vec::new();
        let mut run_parent = parent;
        let mut chain_parent = parent;
        for (i, (block, eh)) in s
            .token_ids
            .chunks_exact(bs)
            .zip(&s.block_hashes)
            .enumerate()
        {
            let seed = if s.opaque_keys(i) {
                opaque_seed(prev, eh)
            } else {
                prev
            };
            let wp = hash_block(seed, block);
            if self.mark(eh, wp, chain_parent, tier, out) {
                if new.is_empty() {
                    run_parent = chain_parent;
                }
                new.push(wp);
            } else {
                // A block already held interrupts the run.
                stored(out, run_parent, std::mem::take(&mut new), tier);
            }
            chain_parent = Some(wp);
            prev = wp.0;
        }
        stored(out, run_parent, new, tier);
    }

    fn offload_store(&mut self, s: &BlockStored, out: &mut Outcome) {
        let tier = tier_of(s.medium.as_ref());
        let mut new = Vec::new();
        let mut first_parent = None;
        for eh in &s.block_hashes {
            let Some(e) = self.entries.get(eh).copied() else {
                out.unresolved += 1;
                continue;
            };
            if self.mark(eh, e.wp, e.parent, tier, out) {
                if new.is_empty() {
                    first_parent = e.parent;
                }
                new.push(e.wp);
            }
        }
        stored(out, first_parent, new, tier);
    }

    /// Records `eh` held in `tier`; true when that is new.
    fn mark(
        &mut self,
        eh: &EngineBlockHash,
        wp: BlockHash,
        parent: Option<BlockHash>,
        tier: Tier,
        out: &mut Outcome,
    ) -> bool {
        if self.present >= self.max_blocks && self.entries.get(eh).is_none_or(|e| e.tiers == 0) {
            out.refused += 1;
            return false;
        }
        let e = self.entries.entry(eh.clone()).or_insert(Entry {
            wp,
            parent,
            tiers: 0,
        });
        let was_empty = e.tiers == 0;
        if e.wp != wp {
            // Same engine hash, different content (a truncated hash's
            // collision, or a peer's garbage): trust the newest, and withdraw
            // the old block where it was published, or its later removal
            // would withdraw only the new one.
            for t in [Tier::Gpu, Tier::Cpu, Tier::Disk] {
                if e.tiers & bit(t) != 0 {
                    out.changes.push(Change::Removed {
                        hashes: vec![e.wp],
                        tier: t,
                    });
                }
            }
            e.tiers = 0;
            e.wp = wp;
            e.parent = parent;
        }
        let fresh = e.tiers & bit(tier) == 0;
        e.tiers |= bit(tier);
        if was_empty {
            self.present += 1;
        }
        fresh
    }

    fn remove(&mut self, hashes: &[EngineBlockHash], tier: Tier, out: &mut Outcome) {
        let mut gone = Vec::new();
        for eh in hashes {
            let Some(e) = self.entries.get_mut(eh) else {
                continue;
            };
            if e.tiers & bit(tier) == 0 {
                continue;
            }
            e.tiers &= !bit(tier);
            gone.push(e.wp);
            if e.tiers == 0 {
                self.present -= 1;
                self.ghosts.push_back(eh.clone());
            }
        }
        while self.ghosts.len() > self.ghost_capacity {
            if let Some(old) = self.ghosts.pop_front() {
                if self.entries.get(&old).is_some_and(|e| e.tiers == 0) {
                    self.entries.remove(&old);
                }
            }
        }
        if !gone.is_empty() {
            out.changes.push(Change::Removed { hashes: gone, tier });
        }
    }
}

/// Records a run of new blocks, if any.
fn stored(out: &mut Outcome, parent: Option<BlockHash>, hashes: Vec<BlockHash>, tier: Tier) {
    if !hashes.is_empty() {
        out.changes.push(Change::Stored {
            parent,
            hashes,
            tier,
        });
    }
}

#[cfg(test)]
#[path = "tracker_tests.rs"]
mod tests;

/// The seed of a block whose extra keys a router cannot derive (see
/// [`BlockStored::opaque_keys`]): the chain so far mixed with the engine's
/// own hash of the block, which covers those keys. The block, and every one
/// chained after it, then never equals a hash a router computes from tokens,
/// so it is never predicted as a hit; equal engine blocks still agree.
fn opaque_seed(prev: u64, eh: &EngineBlockHash) -> u64 {
    const OPAQUE: u64 = 0x6f70_6171_7565_6b79; // "opaqueky"
    let words: Vec<u32> = match eh {
        EngineBlockHash::Int(v) => vec![*v as u32, (*v >> 32) as u32],
        EngineBlockHash::Bytes(b) => b
            .chunks(4)
            .map(|c| {
                c.iter()
                    .rev()
                    .fold(0u32, |acc, &x| (acc << 8) | u32::from(x))
            })
            .collect(),
    };
    hash_block(prev ^ OPAQUE, &words).0
}
