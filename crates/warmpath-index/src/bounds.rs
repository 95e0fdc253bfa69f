//! Bounds on what one index holds (a cap per worker, a cap on the whole index,
//! compaction once dead holders outnumber live ones), so no agent can grow the
//! router's memory past what its engine could cache (docs/cache-index.md, "Bounds").

use super::holders::WorkerSlot;
use super::table::{CacheIndex, IndexError};
use super::tier::Tier;
use std::sync::atomic::Ordering;

/// Why blocks were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Overflow {
    /// The worker already holds its cap of entries.
    WorkerCap,
    /// The index already holds `max_entries` entries.
    MaxEntries,
}

impl Overflow {
    /// Stable name, for metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::WorkerCap => "worker_capacity",
            Overflow::MaxEntries => "max_entries",
        }
    }
}

/// What one bounded store did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// (block, tier) entries that were new.
    pub added: usize,
    /// Blocks not stored because a bound was reached.
    pub refused: usize,
    /// The bound that refused them (the last one hit).
    pub reason: Option<Overflow>,
}

/// Dead entries below this never trigger a compaction by themselves: a map
/// walk for a few thousand holders costs more than the memory they take.
const MIN_DEAD_TO_COMPACT: u64 = 1 << 16;

/// Bytes one map slot takes: 8-byte key, 16-byte holder set, 1 control byte.
const SLOT_BYTES: u64 = 25;

const UNBOUNDED: u64 = u64::MAX;

impl CacheIndex {
    /// Caps the (block, tier) entries `slot` may hold; `None` lifts the cap.
    /// Entries already held above a lowered cap stay (the engine evicts them
    /// in time); only new ones are refused.
    pub fn set_worker_cap(&self, slot: WorkerSlot, cap: Option<u64>) -> Result<(), IndexError> {
        let w = self.entry(slot)?;
        w.cap.store(cap.unwrap_or(UNBOUNDED), Ordering::Relaxed);
        Ok(())
    }

    /// The cap of `slot`, if one is set.
    pub fn worker_cap(&self, slot: WorkerSlot) -> Option<u64> {
        let w = self.workers.get(slot)?;
        Some(w.cap.load(Ordering::Relaxed)).filter(|c| *c != UNBOUNDED)
    }

    /// Caps the entries of the whole index; `None` lifts the cap.
    pub fn set_max_entries(&self, max: Option<u64>) {
        self.max_entries
            .store(max.unwrap_or(UNBOUNDED), Ordering::Relaxed);
    }

    /// Like [`CacheIndex::store`], but refuses blocks beyond the worker's
    /// cap or the index's `max_entries`. A block the worker already holds on
    /// `tier` is never refused (storing it changes nothing).
    pub fn store_bounded(
        &self,
        slot: WorkerSlot,
        tier: Tier,
        hashes: &[warmpath_hash::BlockHash],
    ) -> Result<Stored, IndexError> {
        let w = self.entry(slot)?;
        let gen = w.gen.load(Ordering::Acquire);
        let cap = w.cap.load(Ordering::Relaxed);
        let max = self.max_entries.load(Ordering::Relaxed);
        let mut held = w.total();
        let mut live = self.live.load(Ordering::Relaxed).max(0) as u64;
        let mut out = Stored::default();
        for h in hashes {
            let full = if held >= cap {
                Some(Overflow::WorkerCap)
            } else if live >= max {
                Some(Overflow::MaxEntries)
            } else {
                None
            };
            if let Some(why) = full {
                let already = self
                    .map
                    .get(&h.0)
                    .and_then(|e| e.find(slot))
                    .is_some_and(|x| x.gen() == gen && x.tiers() & tier.bit() != 0);
                if !already {
                    if out.refused == 0 {
                        w.mark_incomplete();
                    }
                    out.refused += 1;
                    out.reason = Some(why);
                }
                continue;
            }
            if self.map.entry(h.0).or_default().add(slot, gen, tier) != 0 {
                out.added += 1;
                held += 1;
                live += 1;
            }
        }
        w.adjust(tier.bit(), out.added as i64);
        self.live.fetch_add(out.added as i64, Ordering::Relaxed);
        Ok(out)
    }

    /// Entries of cleared generations still in the map (not yet compacted).
    pub fn dead_entries(&self) -> u64 {
        self.dead.load(Ordering::Relaxed)
    }

    /// An estimate of the map's memory: allocated slots × `SLOT_BYTES`
    /// (holder sets of three or more workers take further heap, not counted).
    pub fn estimated_bytes(&self) -> u64 {
        self.map.capacity() as u64 * SLOT_BYTES
    }

    /// Compacts when any dead entries or dropped workers' slots wait (for a
    /// timer); returns the blocks removed.
    pub fn compact_dead(&self) -> usize {
        if self.dead_entries() == 0 && self.awaiting_compaction() == 0 {
            return 0;
        }
        self.compact()
    }

    /// `n` entries just died (a cleared worker): compact once the dead
    /// outnumber the live, so dead holders never dominate memory.
    pub(super) fn note_dead(&self, n: u64) {
        let dead = self.dead.fetch_add(n, Ordering::Relaxed) + n;
        let live = self.live.load(Ordering::Relaxed).max(0) as u64;
        if dead >= MIN_DEAD_TO_COMPACT && dead > live {
            self.compact();
        }
    }

    /// Gives back table memory after a compaction left the map mostly empty.
    pub(super) fn shrink_if_sparse(&self) {
        let (len, cap) = (self.map.len(), self.map.capacity());
        if cap > 4096 && cap > 4 * len {
            self.map.shrink_to_fit();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_hash::BlockHash;

    fn hs(from: u64, n: u64) -> Vec<BlockHash> {
        (from..from + n)
            .map(|i| BlockHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect()
    }

    #[test]
    fn worker_cap_refuses_the_excess_and_counts_it() {
        let idx = CacheIndex::new();
        let a = idx.register_worker("a").unwrap();
        idx.set_worker_cap(a, Some(10)).unwrap();
        let s = idx.store_bounded(a, Tier::Gpu, &hs(0, 25)).unwrap();
        assert_eq!(
            (s.added, s.refused, s.reason),
            (10, 15, Some(Overflow::WorkerCap))
        );
        assert_eq!(idx.block_count(a), 10);
        // Blocks already held are not refused, at the cap.
        let s = idx.store_bounded(a, Tier::Gpu, &hs(0, 10)).unwrap();
        assert_eq!((s.added, s.refused), (0, 0));
        // Removing makes room again.
        idx.remove(a, None, &hs(0, 4)).unwrap();
        let s = idx.store_bounded(a, Tier::Gpu, &hs(100, 10)).unwrap();
        assert_eq!((s.added, s.refused), (4, 6));
        assert_eq!(idx.worker_cap(a), Some(10));
        idx.set_worker_cap(a, None).unwrap();
        assert_eq!(idx.worker_cap(a), None);
    }

    #[test]
    fn max_entries_bounds_the_whole_index() {
        let idx = CacheIndex::new();
        let a = idx.register_worker("a").unwrap();
        let b = idx.register_worker("b").unwrap();
        idx.set_max_entries(Some(15));
        assert_eq!(
            idx.store_bounded(a, Tier::Gpu, &hs(0, 10)).unwrap().added,
            10
        );
        let s = idx.store_bounded(b, Tier::Gpu, &hs(0, 10)).unwrap();
        assert_eq!(
            (s.added, s.refused, s.reason),
            (5, 5, Some(Overflow::MaxEntries))
        );
        assert_eq!(idx.entries(), 15);
        idx.clear_worker(a).unwrap();
        assert_eq!(
            idx.store_bounded(b, Tier::Gpu, &hs(20, 10)).unwrap().added,
            10
        );
    }

    #[test]
    fn dead_entries_are_compacted_once_they_outnumber_the_live_and_memory_shrinks() {
        let idx = CacheIndex::new();
        let a = idx.register_worker("a").unwrap();
        let n = 2 * MIN_DEAD_TO_COMPACT;
        idx.store(a, Tier::Gpu, &hs(0, n)).unwrap();
        let full = idx.estimated_bytes();
        assert!(full >= n * SLOT_BYTES, "{full}");
        idx.clear_worker(a).unwrap();
        // More dead than live (0): compacted at once, tables shrunk.
        assert_eq!(idx.dead_entries(), 0);
        assert_eq!(idx.distinct_blocks(), 0);
        assert!(
            idx.estimated_bytes() < full / 8,
            "{}",
            idx.estimated_bytes()
        );
        // A few dead wait for the timer.
        idx.store(a, Tier::Gpu, &hs(0, 100)).unwrap();
        idx.clear_worker(a).unwrap();
        assert_eq!(idx.dead_entries(), 100);
        assert_eq!(idx.distinct_blocks(), 100);
        assert_eq!(idx.compact_dead(), 100);
        assert_eq!((idx.dead_entries(), idx.distinct_blocks()), (0, 0));
        assert_eq!(idx.compact_dead(), 0);
    }
}
