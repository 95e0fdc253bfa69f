//! Observe mode, for engines that publish no KV events: the agent is a sidecar
//! HTTP proxy in front of the engine and infers the engine's prefix cache from
//! the prompts it forwards.
//!
//! - [`proxy`]: forwards every request to the engine (responses, streams
//!   included, pass through chunk by chunk and byte for byte); after the engine
//!   accepted a `POST /v1/chat/completions` or `/v1/completions` (2xx), the
//!   body is queued for the observer. The agent's own pages live under
//!   `/warmpath/` (`/warmpath/health`, `/warmpath/metrics`) so that the
//!   engine's `/health` and `/metrics` stay reachable through the proxy.
//! - [`prompt`]: body -> warmpath block hashes, by the router's rules.
//! - [`mirror`]: the LRU mirror of the engine's cache (`--cache-blocks`).
//! - [`run_observer`]: the task that drains the queue, hashes off the async
//!   runtime, touches the mirror and feeds the resulting Stored / Removed
//!   changes into the same [`Hub`] events mode uses, so publishing to routers
//!   (snapshot + deltas, reconnects) is unchanged.
//!
//! Observation never slows or refuses traffic: the queue is bounded and a
//! full queue drops the observation (counted), never the request.
//!
//! Known limits: the mirror is a model of the engine, not its truth. It
//! assumes the engine caches every full prompt block, uses the same block
//! size, has `--cache-blocks` blocks and evicts LRU; it does not see blocks
//! filled by generated tokens, preemptions or an engine restart (restart the
//! agent with the engine).

pub mod budget;
pub mod mirror;
pub mod prompt;
pub mod proxy;
mod stats;

pub use budget::{ByteBudget, Held, Observed};
pub use mirror::LruMirror;
pub use prompt::{PromptError, PromptHasher};
pub use proxy::{proxy_router, ProxyState};
pub use stats::ObserveStats;

use crate::hub::Hub;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Drains `rx` until `cancel` fires or every sender is gone: hashes each body
/// on the blocking pool, touches `mirror`, and applies the changes to `hub`.
pub async fn run_observer(
    hasher: PromptHasher,
    mut mirror: LruMirror,
    mut rx: mpsc::Receiver<Observed>,
    hub: Arc<Hub>,
    stats: Arc<ObserveStats>,
    cancel: CancellationToken,
) {
    loop {
        let obs = tokio::select! {
            _ = cancel.cancelled() => break,
            o = rx.recv() => match o {
                Some(o) => o,
                None => break,
            },
        };
        let h = hasher.clone();
        let job = tokio::task::spawn_blocking(move || h.hash_body(&obs.body, obs.expect));
        let hashed = tokio::select! {
            _ = cancel.cancelled() => break,
            r = job => r,
        };
        let hashes = match hashed {
            Ok(Ok(hashes)) => hashes,
            Ok(Err(e)) => {
                stats.unhashable.inc();
                metrics::counter!("warmpath_agent_observe_unhashable_total", "reason" => e.reason())
                    .increment(1);
                tracing::debug!(error = %e, "forwarded request not mirrored");
                continue;
            }
            Err(e) => {
                stats.unhashable.inc();
                tracing::error!(error = %e, "prompt hashing task failed");
                continue;
            }
        };
        stats.observed.inc();
        metrics::counter!("warmpath_agent_observe_prompts_total").increment(1);
        let changes = mirror.touch(&hashes);
        for c in &changes {
            match c {
                crate::tracker::Change::Stored { hashes, .. } => {
                    stats.blocks_stored.add(hashes.len() as u64);
                    metrics::counter!("warmpath_agent_observe_blocks_stored_total")
                        .increment(hashes.len() as u64);
                }
                crate::tracker::Change::Removed { hashes, .. } => {
                    stats.blocks_evicted.add(hashes.len() as u64);
                    metrics::counter!("warmpath_agent_observe_blocks_evicted_total")
                        .increment(hashes.len() as u64);
                }
            }
        }
        if !changes.is_empty() {
            hub.apply(changes, warmpath_proto::unix_micros());
        }
        metrics::gauge!("warmpath_agent_observe_mirror_blocks").set(mirror.len() as f64);
    }
    tracing::debug!("observer stopped");
}
