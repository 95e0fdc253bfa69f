//! Prefix closure: when a match walk may skip ahead (a closed worker holding
//! block `e` holds every block before it), and the per-worker version that
//! makes a skip exact: docs/cache-index.md, "Skipping".

use super::holders::WorkerSlot;
use super::table::{CacheIndex, IndexError};
use super::workers::{WorkerEntry, CLAIMED_CLOSED, INCOMPLETE};
use std::sync::atomic::Ordering::SeqCst;

impl CacheIndex {
    /// Records what `slot`'s agent says after its latest change: whether
    /// its holdings are prefix-closed (module docs). Withdrawing the claim
    /// must come before the change that breaks it; making it, after the
    /// change that restores it.
    pub fn set_prefix_closed(&self, slot: WorkerSlot, closed: bool) -> Result<(), IndexError> {
        let w = self.entry(slot)?;
        if closed {
            w.shape.fetch_or(CLAIMED_CLOSED, SeqCst);
        } else if w.shape.fetch_and(!CLAIMED_CLOSED, SeqCst) & CLAIMED_CLOSED != 0 {
            w.version.fetch_add(1, SeqCst);
        }
        Ok(())
    }

    /// Whether walks may skip over `slot`'s runs now: claimed closed, no
    /// holes of the index's making, no removal under way.
    pub fn is_prefix_closed(&self, slot: WorkerSlot) -> bool {
        self.workers
            .get(slot)
            .is_some_and(|w| w.route_state().closed_at.is_some())
    }

    /// Whether each skipped-for worker is still at the version the walk
    /// started with (a walk's final check).
    pub(crate) fn unchanged_since(&self, seen: &[(WorkerSlot, u64)]) -> bool {
        seen.is_empty() || self.workers.unchanged(seen)
    }
}

impl WorkerEntry {
    /// Marks a removal under way until the guard drops.
    pub(crate) fn removal(&self) -> Removal<'_> {
        self.removing.fetch_add(1, SeqCst);
        self.version.fetch_add(1, SeqCst);
        Removal(self)
    }

    /// The index refused one of the worker's blocks: no walk may skip for it
    /// until it is cleared.
    pub(crate) fn mark_incomplete(&self) {
        if self.shape.fetch_or(INCOMPLETE, SeqCst) & INCOMPLETE == 0 {
            self.version.fetch_add(1, SeqCst);
        }
    }

    /// Cleared: it holds nothing, so nothing is missing either.
    pub(crate) fn mark_complete(&self) {
        self.shape.fetch_and(!INCOMPLETE, SeqCst);
    }
}

/// Runs once between a walk and its final check (tests only: it makes the
/// change a walk races with happen at a known point).
#[cfg(test)]
type HookFn = Box<dyn FnOnce(&CacheIndex) + Send>;

#[cfg(test)]
#[derive(Default)]
pub(crate) struct WalkHook(parking_lot::Mutex<Option<HookFn>>);

#[cfg(test)]
impl std::fmt::Debug for WalkHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WalkHook")
    }
}

#[cfg(test)]
impl CacheIndex {
    /// Makes `f` run after the next walk, before its final check.
    pub(crate) fn after_next_walk(&self, f: impl FnOnce(&CacheIndex) + Send + 'static) {
        *self.hook.0.lock() = Some(Box::new(f));
    }

    pub(crate) fn after_walk(&self) {
        let f = self.hook.0.lock().take();
        if let Some(f) = f {
            f(self);
        }
    }
}

/// A removal under way (see [`WorkerEntry::removal`]).
pub(crate) struct Removal<'a>(&'a WorkerEntry);

impl Drop for Removal<'_> {
    fn drop(&mut self) {
        self.0.version.fetch_add(1, SeqCst);
        self.0.removing.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Tier;
    use warmpath_hash::BlockHash;

    fn chain(n: u64) -> Vec<BlockHash> {
        (1..=n).map(BlockHash).collect()
    }

    #[test]
    fn the_claim_holds_until_withdrawn_refused_or_mid_removal() {
        let idx = CacheIndex::new();
        let s = idx.register_worker("w").unwrap();
        assert!(!idx.is_prefix_closed(s), "no claim yet");
        idx.set_prefix_closed(s, true).unwrap();
        assert!(idx.is_prefix_closed(s));
        let w = idx.entry(s).unwrap();
        let v = w.version.load(SeqCst);
        {
            let _r = w.removal();
            assert!(!idx.is_prefix_closed(s), "a removal is under way");
        }
        assert!(idx.is_prefix_closed(s));
        assert_eq!(w.version.load(SeqCst), v + 2);
        idx.set_prefix_closed(s, false).unwrap();
        assert!(!idx.is_prefix_closed(s));
        assert_eq!(w.version.load(SeqCst), v + 3, "withdrawing bumps");
        idx.set_prefix_closed(s, true).unwrap();
        idx.set_worker_cap(s, Some(2)).unwrap();
        let st = idx.store_bounded(s, Tier::Gpu, &chain(3)).unwrap();
        assert_eq!(st.refused, 1);
        assert!(!idx.is_prefix_closed(s), "a refused block is a hole");
        idx.set_prefix_closed(s, true).unwrap();
        assert!(!idx.is_prefix_closed(s), "the claim cannot cover it");
        idx.clear_worker(s).unwrap();
        assert!(idx.is_prefix_closed(s), "cleared: nothing missing");
    }
}
