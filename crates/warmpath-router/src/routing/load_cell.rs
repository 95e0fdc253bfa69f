//! The engine load an agent reported for one worker, in atomics.
//!
//! Routing reads every backend's reported load on every request. Behind
//! the agent registry's lock and two string-keyed maps that read cost about
//! 0.9 µs per backend (BENCHMARKS.md, "with every backend's agent
//! connected"), so the registry keeps each worker's load in one shared
//! [`LoadCell`], and each backend keeps a handle to its worker's cell
//! ([`CellCache`]), looked up again only when the registry's generation
//! changed (a worker claimed anew or removed). The load board
//! (`load_board`) goes further: it reads a cell again only when the cell's
//! change count moved.
//!
//! The fields are separate atomics: a read racing a report may mix two
//! reports' fields, which routing tolerates (a load is a one-second sample).

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use warmpath_core::EngineLoad;

/// Engine load older than this is not used for routing.
pub(crate) const LOAD_FRESH_MS: u64 = 5_000;

const HAS_LOAD: u8 = 1;
const UP_KNOWN: u8 = 2;
const DOWN: u8 = 4;
const PARTIAL: u8 = 8;

/// One worker's latest engine load (module docs).
#[derive(Debug, Default)]
pub(crate) struct LoadCell {
    running: AtomicU32,
    waiting: AtomicU32,
    kv_usage_bits: AtomicU32,
    /// 0: unknown.
    capacity_blocks: AtomicU64,
    flags: AtomicU8,
    /// [`monotonic_ms`] of the report.
    at_ms: AtomicU64,
    /// Bumped after every `set` and `claimed` ([`LoadCell::changes`]).
    changes: AtomicU64,
}

impl LoadCell {
    /// A report arrived at `at_ms`.
    pub(crate) fn set(&self, load: EngineLoad, engine_up: bool, at_ms: u64) {
        self.running.store(load.running, Ordering::Relaxed);
        self.waiting.store(load.waiting, Ordering::Relaxed);
        self.kv_usage_bits
            .store(load.kv_usage.to_bits(), Ordering::Relaxed);
        self.capacity_blocks
            .store(load.capacity_blocks.unwrap_or(0), Ordering::Relaxed);
        self.at_ms.store(at_ms, Ordering::Relaxed);
        let mut f = HAS_LOAD | UP_KNOWN;
        if !engine_up {
            f |= DOWN;
        }
        if load.partial {
            f |= PARTIAL;
        }
        self.flags.store(f, Ordering::Release);
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// A new stream took the worker: whether the engine is up is unknown
    /// again, and a new agent run (`keep_load` false) forgets the old load.
    pub(crate) fn claimed(&self, keep_load: bool) {
        let keep = if keep_load { HAS_LOAD | PARTIAL } else { 0 };
        self.flags.fetch_and(keep, Ordering::AcqRel);
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// How many reports and claims changed it; read before the fields, so
    /// one racing the read shows as a change next time (the load board,
    /// [`crate::routing::load_board`]).
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The last load reported, however old.
    pub(crate) fn last(&self) -> Option<EngineLoad> {
        let f = self.flags.load(Ordering::Acquire);
        (f & HAS_LOAD != 0).then(|| EngineLoad {
            running: self.running.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            kv_usage: f32::from_bits(self.kv_usage_bits.load(Ordering::Relaxed)),
            capacity_blocks: Some(self.capacity_blocks.load(Ordering::Relaxed)).filter(|c| *c > 0),
            partial: f & PARTIAL != 0,
        })
    }

    /// Whether the engine answered the agent's last scrape (`None` before a
    /// report on this stream).
    pub(crate) fn engine_up(&self) -> Option<bool> {
        let f = self.flags.load(Ordering::Acquire);
        (f & UP_KNOWN != 0).then_some(f & DOWN == 0)
    }

    /// [`LoadCell::fresh`], with the last millisecond it stays fresh
    /// without a new report.
    pub(crate) fn fresh_until(&self, now_ms: u64) -> Option<(EngineLoad, u64)> {
        let until = self
            .at_ms
            .load(Ordering::Relaxed)
            .saturating_add(LOAD_FRESH_MS);
        (now_ms <= until && self.engine_up() != Some(false))
            .then(|| self.last())
            .flatten()
            .map(|l| (l, until))
    }

    /// The load routing may use at `now_ms`: reported, the engine not down
    /// at the last scrape, and at most [`LOAD_FRESH_MS`] old.
    pub(crate) fn fresh(&self, now_ms: u64) -> Option<EngineLoad> {
        self.fresh_until(now_ms).map(|(l, _)| l)
    }
}

/// A backend's handle to its worker's [`LoadCell`], valid for one
/// generation of the agent registry (module docs).
#[derive(Debug, Default)]
pub(crate) struct CellCache(Mutex<Option<(u64, Option<Arc<LoadCell>>)>>);

impl CellCache {
    /// `read` of the cell for registry generation `generation` (`None` when
    /// the worker has none), looked up with `lookup` when the cached one is
    /// of another generation. Read in place: no reference count moves.
    pub(crate) fn read<R>(
        &self,
        generation: u64,
        lookup: impl FnOnce() -> Option<Arc<LoadCell>>,
        read: impl FnOnce(&LoadCell) -> R,
    ) -> Option<R> {
        self.current(generation, lookup)
            .as_ref()
            .and_then(|(_, cell)| cell.as_deref())
            .map(read)
    }

    /// The cell itself for `generation`, looked up as [`CellCache::read`]
    /// does, for a reader that keeps it (the load board).
    pub(crate) fn cell(
        &self,
        generation: u64,
        lookup: impl FnOnce() -> Option<Arc<LoadCell>>,
    ) -> Option<Arc<LoadCell>> {
        self.current(generation, lookup)
            .as_ref()
            .and_then(|(_, cell)| cell.clone())
    }

    /// The cache, locked, holding `generation`'s cell.
    fn current(
        &self,
        generation: u64,
        lookup: impl FnOnce() -> Option<Arc<LoadCell>>,
    ) -> MutexGuard<'_, Option<(u64, Option<Arc<LoadCell>>)>> {
        let mut c = self.0.lock();
        if c.as_ref().is_none_or(|(g, _)| *g != generation) {
            *c = Some((generation, lookup()));
        }
        c
    }
}

/// Milliseconds on the router's monotonic clock: the clock of
/// [`CacheIndex::mark_heard`](warmpath_core::CacheIndex::mark_heard) and
/// staleness in this process.
pub(crate) fn monotonic_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn load(running: u32) -> EngineLoad {
        EngineLoad {
            running,
            waiting: 2,
            kv_usage: 0.25,
            capacity_blocks: Some(900),
            partial: true,
        }
    }

    #[test]
    fn a_report_reads_back_while_fresh_and_up() {
        let c = LoadCell::default();
        assert_eq!(c.fresh(10), None, "nothing reported");
        assert_eq!(c.engine_up(), None);
        c.set(load(3), true, 1_000);
        assert_eq!(c.fresh(1_000 + LOAD_FRESH_MS), Some(load(3)));
        assert_eq!(c.fresh(1_001 + LOAD_FRESH_MS), None, "too old");
        assert_eq!(c.last(), Some(load(3)), "the status view keeps it");
        c.set(load(4), false, 2_000);
        assert_eq!(c.fresh(2_000), None, "engine down");
        assert_eq!(c.engine_up(), Some(false));
        let unknown = EngineLoad {
            capacity_blocks: None,
            partial: false,
            ..load(1)
        };
        c.set(unknown, true, 3_000);
        assert_eq!(c.fresh(3_000), Some(unknown));
    }

    #[test]
    fn a_claim_forgets_up_and_a_new_run_forgets_the_load() {
        let c = LoadCell::default();
        c.set(load(3), false, 1_000);
        c.claimed(true);
        assert_eq!(c.engine_up(), None);
        assert_eq!(c.fresh(1_000), Some(load(3)), "same run: the load stays");
        c.claimed(false);
        assert_eq!(c.last(), None);
        assert_eq!(c.fresh(1_000), None);
    }

    #[test]
    fn the_cache_looks_up_again_only_for_a_new_generation() {
        let cache = CellCache::default();
        let cell = Arc::new(LoadCell::default());
        let mut lookups = 0;
        let at = |c: &LoadCell| c as *const LoadCell;
        for _ in 0..3 {
            let got = cache.read(
                1,
                || {
                    lookups += 1;
                    Some(Arc::clone(&cell))
                },
                at,
            );
            assert_eq!(got, Some(Arc::as_ptr(&cell)));
        }
        assert_eq!(lookups, 1);
        assert!(cache.read(2, || None, at).is_none(), "removed");
        assert!(
            cache.read(2, || unreachable!(), at).is_none(),
            "cached absence"
        );
    }
}
