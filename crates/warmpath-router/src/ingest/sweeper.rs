//! Marks silent workers stale, clears the long silent, compacts dead holders
//! and gives freed index memory back ([`set_memory_release`]).

use super::directory::PoolDirectory;
use super::pace::Gates;
use crate::config::COMPACT_INTERVAL_MS;
use crate::http::clock::monotonic_ms;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One sweep over every pool; returns the workers cleared now (the stale
/// gauge is set where it is read, on each scrape).
pub(crate) fn sweep(
    dir: &dyn PoolDirectory,
    stale_after: Duration,
    drop_after: Duration,
    now_ms: u64,
    cleared: &mut std::collections::HashSet<(usize, String)>,
) -> usize {
    let mut newly = 0;
    for (i, pool) in dir.pools().iter().enumerate() {
        let expired = pool.index.refresh_staleness(
            now_ms,
            stale_after.as_millis() as u64,
            drop_after.as_millis() as u64,
        );
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
    newly
}

/// Compacts every pool due since `last[i]` (ms); returns the blocks removed.
pub(crate) fn compact_due(dir: &dyn PoolDirectory, now_ms: u64, last: &mut Vec<u64>) -> usize {
    let pools = dir.pools();
    last.resize(pools.len().max(last.len()), now_ms);
    let mut removed = 0;
    for (pool, at) in pools.iter().zip(last.iter_mut()) {
        if now_ms.saturating_sub(*at) >= COMPACT_INTERVAL_MS {
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

/// Index bytes freed before the next release (one costs milliseconds).
pub(crate) const RELEASE_AFTER_BYTES: u64 = 8 << 20;

/// The binary's (release, catch-up) pair; see [`set_memory_release`].
type Release = (fn(), fn());

static RELEASE: OnceLock<Release> = OnceLock::new();

/// Registers how the process gives freed memory back to the OS: `release`
/// once the indexes shrank by [`RELEASE_AFTER_BYTES`], and `catch_up` at the
/// end of every blocking ingest job (a release frees only its thread's
/// pages). A second call is ignored.
pub fn set_memory_release(release: fn(), catch_up: fn()) {
    let _ = RELEASE.set((release, catch_up));
}

/// The end of a blocking job: give back this thread's freed pages if due.
pub(crate) fn catch_up() {
    if let Some((_, catch_up)) = RELEASE.get() {
        catch_up();
    }
}

/// Whether the memory freed since the last release is worth one (`high`: most held since).
pub(crate) fn release_due(high: &mut u64, now: u64) -> bool {
    *high = (*high).max(now);
    if *high - now >= RELEASE_AFTER_BYTES {
        *high = now;
        return true;
    }
    false
}

/// What a sweep keeps from one round to the next.
#[derive(Default)]
struct Rounds {
    cleared: std::collections::HashSet<(usize, String)>,
    compacted: Vec<u64>,
    high: u64,
}

/// One round: sweep, compact what is due, release freed memory. Holds every
/// pool's gate, taken in name order, so no snapshot or clear runs beside it.
fn round(
    dir: &dyn PoolDirectory,
    gates: &Gates,
    stale_after: Duration,
    drop_after: Duration,
    r: &mut Rounds,
) {
    let mut models: Vec<String> = dir.pools().into_iter().map(|p| p.model).collect();
    models.sort();
    let held: Vec<_> = models.iter().map(|m| gates.of(m)).collect();
    let _guards: Vec<_> = held.iter().map(|g| g.blocking_lock()).collect();
    sweep(dir, stale_after, drop_after, monotonic_ms(), &mut r.cleared);
    compact_due(dir, monotonic_ms(), &mut r.compacted);
    let bytes = dir.pools().iter().map(|p| p.index.estimated_bytes()).sum();
    if release_due(&mut r.high, bytes) {
        if let Some((release, _)) = RELEASE.get() {
            let started = std::time::Instant::now();
            release();
            tracing::debug!(
                index_bytes = bytes,
                took_us = started.elapsed().as_micros() as u64,
                "freed index memory given back"
            );
        }
    }
}

/// Sweeps every half `stale_after` (10 ms to 1 s) until `shutdown`, on the
/// blocking pool under `gates`.
pub(crate) fn spawn_gated(
    dir: Arc<dyn PoolDirectory>,
    stale_after: Duration,
    drop_after: Duration,
    shutdown: CancellationToken,
    gates: Arc<Gates>,
) -> JoinHandle<()> {
    let period = (stale_after / 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
    tokio::spawn(async move {
        let mut rounds = Rounds::default();
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let (d, g) = (Arc::clone(&dir), Arc::clone(&gates));
            let job = tokio::task::spawn_blocking(move || {
                round(d.as_ref(), &g, stale_after, drop_after, &mut rounds);
                catch_up();
                rounds
            });
            match job.await {
                Ok(r) => rounds = r,
                Err(e) => {
                    tracing::error!(error = %e, "the index sweeper failed; stale agents are no longer cleared");
                    return;
                }
            }
        }
    })
}
