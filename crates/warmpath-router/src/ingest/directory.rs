//! Where the ingest finds a pool by model, and how another replica's
//! decision reaches a pool's policy.

use crate::routing::pool::Pools;
use std::sync::Arc;
use warmpath_core::CacheIndex;
use warmpath_proto::v1;

/// The index and block size of one pool, as the ingest needs them.
#[derive(Clone, Debug)]
pub struct IngestPool {
    pub model: String,
    pub index: Arc<CacheIndex>,
    /// Tokens per block of the pool.
    pub block_size: usize,
    /// The worker ids of the pool's backends: a Hello for another is refused.
    pub known_workers: Option<Arc<[String]>>,
    /// Bounds of `index`.
    pub bounds: crate::config::IndexSettings,
}

impl IngestPool {
    fn of(p: &crate::routing::pool::Pool) -> Self {
        IngestPool {
            model: p.model.clone(),
            index: Arc::clone(&p.index),
            block_size: p.block_size,
            known_workers: Some(
                p.backends()
                    .iter()
                    .map(|b| b.endpoint.id().to_owned())
                    .collect(),
            ),
            bounds: p.index_bounds,
        }
    }
}

/// Where the ingest finds pools by model.
pub trait PoolDirectory: Send + Sync + 'static {
    /// The pool serving base model `model`.
    fn pool(&self, model: &str) -> Option<IngestPool>;
    fn pools(&self) -> Vec<IngestPool>;
    /// Records another replica's pick for `worker` in the pool's policy.
    fn observe_remote(&self, _model: &str, _worker: &str, _decided: &v1::Decided) {}
}

impl PoolDirectory for Pools {
    fn pool(&self, model: &str) -> Option<IngestPool> {
        self.get(model).map(|p| IngestPool::of(p))
    }
    fn pools(&self) -> Vec<IngestPool> {
        self.all.iter().map(|p| IngestPool::of(p)).collect()
    }
    /// Records another replica's `start` about `worker` in the pool's policy
    /// (a policy without memory records nothing).
    fn observe_remote(&self, model: &str, worker: &str, d: &v1::Decided) {
        use warmpath_core::policy::{HomeView, RemoteDecision};
        let Some(state) = self.get(model).map(|p| p.policy()) else {
            return;
        };
        let Some(learns) = &state.learns else {
            return;
        };
        let at = |id: &str| state.backends.iter().position(|b| b.endpoint.id() == id);
        let Some(backend) = at(worker) else {
            return;
        };
        let home = (!d.home.is_empty())
            .then(|| at(&d.home))
            .flatten()
            .map(|b| HomeView {
                backend: b,
                copies: d.copies.iter().filter_map(|c| at(c)).collect(),
            });
        learns.observe_remote(&RemoteDecision {
            prefix_key: d.prefix_key,
            backend,
            chain_blocks: d.chain_blocks,
            prefill_blocks: u32::try_from(d.prefill_blocks).unwrap_or(u32::MAX),
            home,
        });
    }
}
