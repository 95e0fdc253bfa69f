//! Per-worker bookkeeping of one index: names, generations, block counts per
//! tier and liveness (last heard, stale). Time is passed in by the caller as
//! milliseconds of a monotonic clock, so this stays pure and testable.

use super::holders::WorkerSlot;
use super::tier::Tier;
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// What the index knows of one worker, for `/cache-index` and the policies.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WorkerStats {
    /// The worker id (as configured or announced by its agent).
    pub worker_id: String,
    /// Blocks held, all tiers, then per tier.
    pub blocks: u64,
    pub gpu_blocks: u64,
    pub cpu_blocks: u64,
    pub disk_blocks: u64,
    /// Milliseconds since its agent was last heard, if ever.
    pub last_heard_ms_ago: Option<u64>,
    /// Whether its entries are currently ignored for routing.
    pub stale: bool,
    /// Whether walks skip over its runs: its agent says its blocks are
    /// prefix-closed and the index holds all of them (index `closure`).
    pub prefix_closed: bool,
}

#[derive(Debug)]
pub(crate) struct WorkerEntry {
    pub(crate) id: String,
    pub(crate) gen: AtomicU8,
    /// Counts per tier: GPU, CPU, disk.
    pub(crate) counts: [AtomicI64; 3],
    /// Monotonic ms when last heard; `u64::MAX` = never.
    pub(crate) last_heard: AtomicU64,
    pub(crate) stale: AtomicBool,
    pub(crate) bumps_since_compact: AtomicU8,
    /// Entries those bumps left behind (0: none of an older generation
    /// is in the map, so the generation may wrap without a compaction).
    pub(crate) dead_since_compact: AtomicU64,
    /// Most entries it may hold (`u64::MAX`: no cap); see `bounds`.
    pub(crate) cap: AtomicU64,
    /// [`CLAIMED_CLOSED`] and [`INCOMPLETE`] (see `closure`).
    pub(crate) shape: AtomicU8,
    /// Removals under way now (see `closure`).
    pub(crate) removing: AtomicU32,
    /// Bumped around every change that may break prefix closure.
    pub(crate) version: AtomicU64,
}

/// Its agent says the worker's blocks are prefix-closed (see `closure`).
pub(crate) const CLAIMED_CLOSED: u8 = 1;
/// The index refused some of its blocks: what it holds has holes.
pub(crate) const INCOMPLETE: u8 = 2;

/// What a match walk needs of one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RouteState {
    pub(crate) gen: u8,
    pub(crate) fresh: bool,
    /// The worker's version when its holdings are prefix-closed and no
    /// removal is under way (the walk may then skip, see `closure`).
    pub(crate) closed_at: Option<u64>,
}

impl WorkerEntry {
    /// A new worker whose generation starts at `gen` (0 in a new slot; in a
    /// reused one, past any the slot's previous worker wrote).
    fn new(id: String, gen: u8) -> Self {
        WorkerEntry {
            id,
            gen: AtomicU8::new(gen),
            counts: Default::default(),
            last_heard: AtomicU64::new(u64::MAX),
            stale: AtomicBool::new(false),
            bumps_since_compact: AtomicU8::new(0),
            dead_since_compact: AtomicU64::new(0),
            cap: AtomicU64::new(u64::MAX),
            shape: AtomicU8::new(0),
            removing: AtomicU32::new(0),
            version: AtomicU64::new(0),
        }
    }

    pub(crate) fn route_state(&self) -> RouteState {
        let shape = self.shape.load(Ordering::SeqCst);
        let closed_at = (shape == CLAIMED_CLOSED && self.removing.load(Ordering::SeqCst) == 0)
            .then(|| self.version.load(Ordering::SeqCst));
        RouteState {
            gen: self.gen.load(Ordering::Acquire),
            fresh: !self.stale.load(Ordering::Relaxed),
            closed_at,
        }
    }

    pub(crate) fn count(&self, tier: Tier) -> u64 {
        self.counts[tier as usize].load(Ordering::Relaxed).max(0) as u64
    }

    pub(crate) fn adjust(&self, tier_bits: u8, delta: i64) {
        for t in Tier::ALL {
            if tier_bits & t.bit() != 0 {
                self.counts[t as usize].fetch_add(delta, Ordering::Relaxed);
            }
        }
    }

    /// Entries held, all tiers.
    pub(crate) fn total(&self) -> u64 {
        Tier::ALL.iter().map(|t| self.count(*t)).sum()
    }

    /// Zeroes the counts; returns the entries they held.
    pub(crate) fn reset_counts(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| c.swap(0, Ordering::Relaxed).max(0) as u64)
            .sum()
    }

    pub(crate) fn stats(&self, now_ms: u64) -> WorkerStats {
        let last = self.last_heard.load(Ordering::Relaxed);
        let [gpu, cpu, disk] = Tier::ALL.map(|t| self.count(t));
        WorkerStats {
            worker_id: self.id.clone(),
            blocks: gpu + cpu + disk,
            gpu_blocks: gpu,
            cpu_blocks: cpu,
            disk_blocks: disk,
            last_heard_ms_ago: (last != u64::MAX).then(|| now_ms.saturating_sub(last)),
            stale: self.stale.load(Ordering::Relaxed),
            prefix_closed: self.route_state().closed_at.is_some(),
        }
    }
}

/// Slot allocation: worker id <-> dense slot.
///
/// A dropped worker's slot is tombstoned at once (a late write for it fails)
/// and taken again only once no holder of it can be left in the map: at
/// once when it held nothing, else after the next compaction that started
/// after the drop ([`Workers::retired`], then [`Workers::release`]). Free
/// slots are reused lowest first, so slot numbers (and what a walk sizes
/// by the highest slot) stay as small as the pool.
#[derive(Debug, Default)]
pub(crate) struct Workers {
    by_id: RwLock<HashMap<String, WorkerSlot>>,
    slots: RwLock<Vec<Option<Arc<WorkerEntry>>>>,
    reuse: Mutex<Reuse>,
}

/// Dropped slots: those awaiting a compaction, and those free to take, each
/// with the generation its next worker starts at (one past the last its
/// dropped worker had, so a holder a write in flight left behind at the
/// drop never counts for the next worker).
#[derive(Debug, Default)]
struct Reuse {
    retired: Vec<(WorkerSlot, u8)>,
    free: BTreeMap<WorkerSlot, u8>,
}

impl Workers {
    pub(crate) fn slot_of(&self, id: &str) -> Option<WorkerSlot> {
        self.by_id.read().get(id).copied()
    }

    /// The slot of `id`, registering it when new (in the lowest free slot).
    /// `None` when all 65536 slots are taken or await a compaction.
    pub(crate) fn register(&self, id: &str) -> Option<WorkerSlot> {
        if let Some(s) = self.slot_of(id) {
            return Some(s);
        }
        let mut by_id = self.by_id.write();
        if let Some(s) = by_id.get(id) {
            return Some(*s);
        }
        let mut slots = self.slots.write();
        let reused = self.reuse.lock().free.pop_first();
        let slot = match reused {
            Some((slot, gen)) => {
                slots[slot as usize] = Some(Arc::new(WorkerEntry::new(id.to_owned(), gen)));
                slot
            }
            None => {
                let slot = WorkerSlot::try_from(slots.len()).ok()?;
                slots.push(Some(Arc::new(WorkerEntry::new(id.to_owned(), 0))));
                slot
            }
        };
        by_id.insert(id.to_owned(), slot);
        Some(slot)
    }

    pub(crate) fn get(&self, slot: WorkerSlot) -> Option<Arc<WorkerEntry>> {
        self.slots.read().get(slot as usize).cloned().flatten()
    }

    /// Tombstones `id`; returns its slot and its entry (the caller says,
    /// through [`Workers::retire`], when the slot may be taken again).
    pub(crate) fn remove(&self, id: &str) -> Option<(WorkerSlot, Arc<WorkerEntry>)> {
        let slot = self.by_id.write().remove(id)?;
        let entry = self.slots.write().get_mut(slot as usize)?.take()?;
        Some((slot, entry))
    }

    /// A tombstoned slot whose last generation was `gen` may be taken again:
    /// now when `empty` (no holder of it is in the map), else after the next
    /// compaction.
    pub(crate) fn retire(&self, slot: WorkerSlot, gen: u8, empty: bool) {
        let next = gen.wrapping_add(1);
        let mut r = self.reuse.lock();
        if empty {
            r.free.insert(slot, next);
        } else {
            r.retired.push((slot, next));
        }
    }

    /// The slots awaiting a compaction now (a compaction reads this before
    /// it reads the generations, and releases exactly these after).
    pub(crate) fn retired(&self) -> Vec<WorkerSlot> {
        self.reuse.lock().retired.iter().map(|(s, _)| *s).collect()
    }

    /// `purged` (from [`Workers::retired`]) hold nothing any more: free.
    pub(crate) fn release(&self, purged: &[WorkerSlot]) {
        if purged.is_empty() {
            return;
        }
        let purged: HashSet<WorkerSlot> = purged.iter().copied().collect();
        let mut r = self.reuse.lock();
        let Reuse { retired, free } = &mut *r;
        retired.retain(|&(s, gen)| {
            let done = purged.contains(&s);
            if done {
                free.insert(s, gen);
            }
            !done
        });
    }

    /// (Awaiting a compaction, free) slots.
    pub(crate) fn reusable(&self) -> (usize, usize) {
        let r = self.reuse.lock();
        (r.retired.len(), r.free.len())
    }

    /// A snapshot of the current generation per slot (`None` = dropped).
    pub(crate) fn generations(&self) -> Vec<Option<u8>> {
        self.slots
            .read()
            .iter()
            .map(|e| e.as_ref().map(|e| e.gen.load(Ordering::Acquire)))
            .collect()
    }

    /// What a match walk needs of each of `slots` (`None`: not registered,
    /// or dropped), under one read of the table: a walk needs it only for
    /// the first block's holders, not for every worker.
    pub(crate) fn routing_state(
        &self,
        slots: impl IntoIterator<Item = WorkerSlot>,
    ) -> Vec<Option<RouteState>> {
        let table = self.slots.read();
        slots
            .into_iter()
            .map(|s| table.get(s as usize)?.as_ref().map(|e| e.route_state()))
            .collect()
    }

    /// Whether each of `seen`'s workers is still at its version, under one
    /// read of the table (a skipping walk's final check, `closure`).
    pub(crate) fn unchanged(&self, seen: &[(WorkerSlot, u64)]) -> bool {
        let table = self.slots.read();
        seen.iter().all(|&(s, v)| {
            table
                .get(s as usize)
                .and_then(Option::as_ref)
                .is_some_and(|e| e.version.load(Ordering::SeqCst) == v)
        })
    }

    /// Generation and freshness of every slot (the reference walk's view).
    #[cfg(test)]
    pub(crate) fn routing_view(&self) -> Vec<Option<(u8, bool)>> {
        self.slots
            .read()
            .iter()
            .map(|e| {
                e.as_ref().map(|e| {
                    (
                        e.gen.load(Ordering::Acquire),
                        !e.stale.load(Ordering::Relaxed),
                    )
                })
            })
            .collect()
    }

    pub(crate) fn all(&self) -> Vec<Arc<WorkerEntry>> {
        self.slots.read().iter().flatten().cloned().collect()
    }
}
