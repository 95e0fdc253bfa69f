//! The index's table: the block map, the workers and the bounds' counters;
//! the walks, bounds and closure checks add their methods in sibling files.

use super::holders::{Holders, WorkerSlot};
use super::tier::Tier;
use super::workers::{WorkerEntry, WorkerStats, Workers};
use dashmap::DashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use thiserror::Error;
use warmpath_hash::BlockHash;
use warmpath_hash::IdentityHasher;

/// Errors of the index.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum IndexError {
    /// Every one of the 65536 worker slots of this index is taken (by a
    /// worker, or by a dropped one until the next compaction). Retry after
    /// removing a worker.
    #[error(
        "the index has no free worker slot (65536 workers registered or awaiting a compaction)"
    )]
    TooManyWorkers,
    /// The worker is not (or no longer) registered. Retry after registering it.
    #[error("unknown worker slot {0}")]
    UnknownWorker(WorkerSlot),
}

pub(super) type Map = DashMap<u64, Holders, BuildHasherDefault<IdentityHasher>>;

/// Generation bumps of one worker after which the index compacts itself.
pub(super) const COMPACT_AFTER_BUMPS: u8 = 200;

/// The concurrent cache index of one pool. See the module docs.
#[derive(Debug)]
pub struct CacheIndex {
    pub(super) map: Map,
    pub(super) workers: Workers,
    /// Entries counted now (sum of the workers' counts), for `max_entries`.
    pub(super) live: AtomicI64,
    /// Entries of cleared generations not yet compacted away ([`bounds`]).
    pub(super) dead: AtomicU64,
    /// Most entries the index takes (`u64::MAX`: no bound).
    pub(super) max_entries: AtomicU64,
    #[cfg(test)]
    pub(super) hook: super::closure::WalkHook,
}

impl Default for CacheIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl CacheIndex {
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty index with room for `blocks` distinct blocks.
    pub fn with_capacity(blocks: usize) -> Self {
        CacheIndex {
            map: Map::with_capacity_and_hasher_and_shard_amount(blocks, Default::default(), 128),
            workers: Workers::default(),
            live: AtomicI64::new(0),
            dead: AtomicU64::new(0),
            max_entries: AtomicU64::new(u64::MAX),
            #[cfg(test)]
            hook: Default::default(),
        }
    }

    /// The slot of worker `id`, registering it if new.
    pub fn register_worker(&self, id: &str) -> Result<WorkerSlot, IndexError> {
        self.workers.register(id).ok_or(IndexError::TooManyWorkers)
    }

    /// The slot of a registered worker.
    pub fn worker_slot(&self, id: &str) -> Option<WorkerSlot> {
        self.workers.slot_of(id)
    }

    pub(super) fn entry(
        &self,
        slot: WorkerSlot,
    ) -> Result<std::sync::Arc<WorkerEntry>, IndexError> {
        self.workers
            .get(slot)
            .ok_or(IndexError::UnknownWorker(slot))
    }

    /// Records that `slot` holds `hashes` on `tier`. Returns how many
    /// (block, tier) entries were new. Blocks beyond a bound set with
    /// [`CacheIndex::set_worker_cap`] or [`CacheIndex::set_max_entries`] are
    /// not stored; [`CacheIndex::store_bounded`] says how many.
    pub fn store(
        &self,
        slot: WorkerSlot,
        tier: Tier,
        hashes: &[BlockHash],
    ) -> Result<usize, IndexError> {
        self.store_bounded(slot, tier, hashes).map(|s| s.added)
    }

    /// Records that `slot` no longer holds `hashes` on `tier` (every tier with
    /// `None`). Unknown hashes are ignored. Returns how many entries went.
    pub fn remove(
        &self,
        slot: WorkerSlot,
        tier: Option<Tier>,
        hashes: &[BlockHash],
    ) -> Result<usize, IndexError> {
        let w = self.entry(slot)?;
        let gen = w.gen.load(Ordering::Acquire);
        let _under_way = w.removal();
        let mut removed = 0usize;
        for h in hashes {
            let mut empty = false;
            if let Some(mut e) = self.map.get_mut(&h.0) {
                let bits = e.remove(slot, gen, tier);
                if bits != 0 {
                    removed += 1;
                    w.adjust(bits, -1);
                    self.live
                        .fetch_sub(i64::from(bits.count_ones()), Ordering::Relaxed);
                }
                empty = e.is_empty();
            }
            if empty {
                self.map.remove_if(&h.0, |_, v| v.is_empty());
            }
        }
        Ok(removed)
    }

    /// Forgets everything `slot` holds, in O(1) (see module docs).
    pub fn clear_worker(&self, slot: WorkerSlot) -> Result<(), IndexError> {
        let w = self.entry(slot)?;
        w.gen.fetch_add(1, Ordering::AcqRel);
        w.mark_complete();
        let n = w.reset_counts();
        self.live.fetch_sub(n as i64, Ordering::Relaxed);
        let dead = w.dead_since_compact.fetch_add(n, Ordering::Relaxed) + n;
        if w.bumps_since_compact.fetch_add(1, Ordering::Relaxed) + 1 < COMPACT_AFTER_BUMPS {
            self.note_dead(n);
        } else if dead == 0 {
            // Only empty sets were cleared since the last compaction: no
            // entry of an older generation can alias the wrapped one, and a
            // peer clearing an empty worker over and over forces no pass
            // over the whole map.
            w.bumps_since_compact.store(0, Ordering::Relaxed);
        } else {
            self.compact();
        }
        Ok(())
    }

    /// Removes worker `id` and all it holds, in O(1): its entries stop
    /// counting at once and its holders are purged by the next compaction,
    /// which the caller runs when [`CacheIndex::awaiting_compaction`] says
    /// so (off the async threads; [`CacheIndex::compact_dead`] also does).
    /// Its slot is taken again only once none of its holders can be left:
    /// at once when it held nothing, else after that compaction.
    pub fn drop_worker(&self, id: &str) -> bool {
        let Some((slot, w)) = self.workers.remove(id) else {
            return false;
        };
        // Bumped after the tombstone: a write in flight that read the entry
        // before leaves holders of a generation the slot's next worker
        // never has (it starts one past this one).
        let gen = w.gen.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        let n = w.reset_counts();
        self.live.fetch_sub(n as i64, Ordering::Relaxed);
        let older = w.dead_since_compact.load(Ordering::Relaxed);
        self.dead.fetch_add(n, Ordering::Relaxed);
        self.workers.retire(slot, gen, n == 0 && older == 0);
        true
    }

    /// Dropped workers' slots whose holders a compaction must purge before
    /// the slots are taken again.
    pub fn awaiting_compaction(&self) -> usize {
        self.workers.reusable().0
    }

    /// Purges holders left behind by cleared or dropped workers and gives
    /// table memory back when the map became sparse; returns the number of
    /// blocks that became empty and were removed. The slots of workers
    /// dropped before it started are free after it.
    pub fn compact(&self) -> usize {
        // Read before the generations: each of these is tombstoned there, so
        // the pass below removes every holder of theirs.
        let purging = self.workers.retired();
        self.dead.store(0, Ordering::Relaxed);
        let gens = self.workers.generations();
        let current = |s: WorkerSlot| gens.get(s as usize).copied().flatten();
        let before = self.map.len();
        self.map.retain(|_, v| {
            v.retain_current(&current);
            !v.is_empty()
        });
        for w in self.workers.all() {
            w.bumps_since_compact.store(0, Ordering::Relaxed);
            w.dead_since_compact.store(0, Ordering::Relaxed);
        }
        self.workers.release(&purging);
        self.shrink_if_sparse();
        before.saturating_sub(self.map.len())
    }

    /// Records that `slot`'s agent was heard at `now_ms` (monotonic), which
    /// also makes it fresh again.
    pub fn mark_heard(&self, slot: WorkerSlot, now_ms: u64) -> Result<(), IndexError> {
        let w = self.entry(slot)?;
        w.last_heard.store(now_ms, Ordering::Relaxed);
        w.stale.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Marks workers silent for longer than `stale_after_ms` as stale: their
    /// entries stop counting in [`CacheIndex::longest_match`] until they are
    /// heard again. Workers never heard are left alone. Returns the ids of the
    /// workers that are silent for longer than `drop_after_ms` (the caller
    /// decides whether to clear or drop them).
    pub fn refresh_staleness(
        &self,
        now_ms: u64,
        stale_after_ms: u64,
        drop_after_ms: u64,
    ) -> Vec<String> {
        let mut expired = Vec::new();
        for w in self.workers.all() {
            let last = w.last_heard.load(Ordering::Relaxed);
            if last == u64::MAX {
                continue;
            }
            let silent = now_ms.saturating_sub(last);
            if silent > stale_after_ms {
                w.stale.store(true, Ordering::Relaxed);
            }
            if silent > drop_after_ms {
                expired.push(w.id.clone());
            }
        }
        expired
    }

    /// Blocks (all tiers) that `slot` holds.
    pub fn block_count(&self, slot: WorkerSlot) -> u64 {
        self.workers.get(slot).map_or(0, |w| w.total())
    }

    /// Statistics of every registered worker.
    pub fn worker_stats(&self, now_ms: u64) -> Vec<WorkerStats> {
        self.workers.all().iter().map(|w| w.stats(now_ms)).collect()
    }

    /// Distinct blocks indexed (including holders not yet compacted away).
    pub fn distinct_blocks(&self) -> usize {
        self.map.len()
    }

    /// (block, worker, tier) entries currently counted.
    pub fn entries(&self) -> u64 {
        self.workers.all().iter().map(|w| w.total()).sum()
    }

    /// The workers holding `hash` (current generation, any tier), as
    /// (worker id, tier list). For inspection, not for the hot path.
    pub fn holders_of(&self, hash: BlockHash) -> Vec<(String, Vec<Tier>)> {
        let Some(e) = self.map.get(&hash.0) else {
            return Vec::new();
        };
        e.iter()
            .filter_map(|h| {
                let w = self.workers.get(h.slot())?;
                (w.gen.load(Ordering::Acquire) == h.gen()).then(|| {
                    let tiers = Tier::ALL
                        .into_iter()
                        .filter(|t| h.tiers() & t.bit() != 0)
                        .collect();
                    (w.id.clone(), tiers)
                })
            })
            .collect()
    }

    /// The id of the worker in `slot`.
    pub fn worker_id(&self, slot: WorkerSlot) -> Option<String> {
        self.workers.get(slot).map(|w| w.id.clone())
    }
}
