//! Marks silent workers stale and clears the ones silent for too long, and
//! compacts each pool's dead holders every `index.compact_interval_ms`.

use super::PoolDirectory;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One sweep over every pool; returns (stale workers, workers cleared now).
pub(crate) fn sweep(
    dir: &dyn PoolDirectory,
    stale_after: Duration,
    drop_after: Duration,
    now_ms: u64,
    cleared: &mut std::collections::HashSet<(usize, String)>,
) -> (usize, usize) {
    let mut stale = 0;
    let mut newly = 0;
    for (i, pool) in dir.pools().iter().enumerate() {
        let expired = pool.index.refresh_staleness(
            now_ms,
            stale_after.as_millis() as u64,
            drop_after.as_millis() as u64,
        );
        let pool_stale = pool
            .index
            .worker_stats(now_ms)
            .iter()
            .filter(|w| w.stale)
            .count();
        metrics::gauge!("warmpath_stale_workers", "pool" => pool.model.clone())
            .set(pool_stale as f64);
        stale += pool_stale;
        for id in &expired {
            if cleared.insert((i, id.clone())) {
                if let Some(slot) = pool.index.worker_slot(id) {
                    let _ = pool.index.clear_worker(slot);
                    tracing::warn!(worker = %id, "agent silent past the drop deadline; entries cleared");
                    newly += 1;
                }
            }
        }
        // Workers heard again become clearable again later.
        cleared.retain(|(p, id)| *p != i || expired.contains(id));
    }
    (stale, newly)
}

/// Compacts every pool whose `index.compact_interval_ms` has passed since
/// `last[i]` (ms; pools beyond `last` start now); returns the blocks removed.
pub(crate) fn compact_due(dir: &dyn PoolDirectory, now_ms: u64, last: &mut Vec<u64>) -> usize {
    let pools = dir.pools();
    last.resize(pools.len().max(last.len()), now_ms);
    let mut removed = 0;
    for (pool, at) in pools.iter().zip(last.iter_mut()) {
        if now_ms.saturating_sub(*at) >= pool.bounds.compact_interval_ms {
            *at = now_ms;
            let n = pool.index.compact_dead();
            if n > 0 {
                tracing::debug!(pool = %pool.model, blocks = n, "index compacted");
            }
            removed += n;
        }
    }
    removed
}

/// Sweeps every `period` until `shutdown`.
pub fn spawn_sweeper(
    dir: Arc<dyn PoolDirectory>,
    stale_after: Duration,
    drop_after: Duration,
    period: Duration,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut cleared = std::collections::HashSet::new();
        let mut compacted = Vec::new();
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            sweep(
                dir.as_ref(),
                stale_after,
                drop_after,
                crate::monotonic_ms(),
                &mut cleared,
            );
            compact_due(dir.as_ref(), crate::monotonic_ms(), &mut compacted);
        }
    })
}
