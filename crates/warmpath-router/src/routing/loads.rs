//! The loads routing reads beside its own counters: what the agents report
//! of each engine ([`AgentLoads`], implemented by the ingest).

use super::load_cell::LoadCell;
use std::sync::Arc;

/// Engine load reported by agents, as the router reads it when routing
/// (implemented by [`crate::ingest::Agents`]).
pub(crate) trait AgentLoads: Send + Sync {
    /// The latest load reported for `worker_id` of pool `model`, if known
    /// and recent, looked up (routing reads it through each backend's
    /// cached cell instead: `Backend::engine_load`; tests look it up).
    #[cfg(test)]
    fn engine_load(&self, model: &str, worker_id: &str) -> Option<warmpath_core::EngineLoad> {
        self.load_cell(model, worker_id)?
            .fresh(super::load_cell::monotonic_ms())
    }

    /// Other router replicas' requests in flight on `worker_id` and their
    /// predicted prefill blocks, as shared through the agents (module `peers`).
    fn remote_load(&self, _model: &str, _worker_id: &str) -> (u32, u64) {
        (0, 0)
    }

    /// Bumped whenever [`load_cell`](Self::load_cell) may answer differently
    /// for some worker: a handle cached at one generation is good until the
    /// next.
    fn cell_generation(&self) -> u64;

    /// The cell holding `worker_id`'s reported load, which routing reads
    /// without a lookup once a backend cached it (`load_cell`).
    fn load_cell(&self, model: &str, worker_id: &str) -> Option<Arc<LoadCell>>;

    /// Whether this router shares its decisions with its replicas: kv_aware
    /// then breaks ties with an rng seeded by the prefix key, so replicas
    /// of the same state agree.
    fn shares_decisions(&self) -> bool {
        false
    }

    /// Whether [`remote_load`](Self::remote_load) may answer anything but
    /// zeros (a replica shared a start with this router): the load board
    /// does not track those loads, so routing then reads every backend's.
    fn remote_loads(&self) -> bool {
        false
    }
}
