//! What the router knows of each agent: epoch, owning stream, sequence,
//! block size, lag and the engine load it reports. Read by routing (engine
//! load) and by `/cache-index` (status).

use parking_lot::RwLock;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use warmpath_core::EngineLoad;
use warmpath_proto::v1;

/// Engine load older than this is not used for routing.
const LOAD_FRESH_MS: u64 = 5_000;

/// (model, worker id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AgentKey {
    pub(crate) model: String,
    pub(crate) worker_id: String,
}

/// One agent's status, as `/cache-index` shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AgentStatus {
    /// Worker id.
    pub worker_id: String,
    /// The engine URL the agent announced.
    pub endpoint: String,
    /// The agent run (epoch) currently publishing.
    pub epoch: u64,
    /// Tokens per block the agent learned from its engine (0 = not yet).
    pub block_size: u32,
    /// Whether a stream is open now.
    pub connected: bool,
    /// Last applied snapshot/delta sequence.
    pub last_seq: Option<u64>,
    /// Snapshots applied since the router started.
    pub snapshots: u64,
    /// Event-to-index lag of the latest delta, milliseconds.
    pub lag_ms: Option<f64>,
    /// Milliseconds since the agent was last heard.
    pub last_heard_ms_ago: u64,
    /// The latest engine load the agent reported.
    pub load: Option<EngineLoad>,
    /// Whether the engine answered the agent's last scrape.
    pub engine_up: Option<bool>,
    /// Why the router last refused this agent (block size mismatch, older
    /// epoch), until a stream of it is accepted again.
    pub refused: Option<String>,
}

#[derive(Debug)]
struct Entry {
    status: AgentStatus,
    owner: Option<u64>,
    last_heard_ms: u64,
    load_at_ms: u64,
}

/// Every agent known to this router.
#[derive(Debug, Default)]
pub struct Agents {
    /// model -> worker id -> entry (nested so reads can look up by `&str`).
    map: RwLock<HashMap<String, HashMap<String, Entry>>>,
    next_stream: AtomicU64,
}

impl Agents {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives the worker to a new stream. Refuses an older epoch than the one
    /// known; the same or a newer epoch takes over (a reconnect whose old
    /// connection is not yet noticed dead).
    pub(crate) fn claim(
        &self,
        key: &AgentKey,
        hello: &v1::Hello,
        now_ms: u64,
    ) -> Result<u64, String> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed) + 1;
        let mut all = self.map.write();
        let map = all.entry(key.model.clone()).or_default();
        if let Some(e) = map.get(&key.worker_id) {
            if hello.epoch < e.status.epoch {
                return Err(format!(
                    "epoch {} is older than the epoch {} already publishing for worker {}",
                    hello.epoch, e.status.epoch, key.worker_id
                ));
            }
        }
        let prev = map.remove(&key.worker_id);
        let same_epoch = prev.as_ref().is_some_and(|p| p.status.epoch == hello.epoch);
        let status = AgentStatus {
            worker_id: key.worker_id.clone(),
            endpoint: hello.endpoint.clone(),
            epoch: hello.epoch,
            block_size: hello.block_size,
            connected: true,
            last_seq: None,
            snapshots: prev.as_ref().map_or(0, |p| p.status.snapshots),
            lag_ms: None,
            last_heard_ms_ago: 0,
            load: prev
                .as_ref()
                .and_then(|p| same_epoch.then_some(p.status.load).flatten()),
            engine_up: None,
            refused: None,
        };
        map.insert(
            key.worker_id.clone(),
            Entry {
                status,
                owner: Some(id),
                last_heard_ms: now_ms,
                load_at_ms: prev.map_or(0, |p| p.load_at_ms),
            },
        );
        Ok(id)
    }

    fn with<T>(&self, key: &AgentKey, f: impl FnOnce(&Entry) -> T) -> Option<T> {
        let map = self.map.read();
        map.get(&key.model)?.get(&key.worker_id).map(f)
    }

    pub(crate) fn owner(&self, key: &AgentKey) -> Option<u64> {
        self.with(key, |e| e.owner).flatten()
    }

    pub(crate) fn disconnect(&self, key: &AgentKey, stream: u64) {
        if let Some(e) = self
            .map
            .write()
            .get_mut(&key.model)
            .and_then(|m| m.get_mut(&key.worker_id))
        {
            if e.owner == Some(stream) {
                e.owner = None;
                e.status.connected = false;
            }
        }
    }

    /// Records why a stream of a known agent was refused (shown by
    /// `/cache-index`). Unknown agents are not added: refusals must not grow
    /// the registry.
    pub(crate) fn refused(&self, key: &AgentKey, reason: &str) {
        if let Some(e) = self
            .map
            .write()
            .get_mut(&key.model)
            .and_then(|m| m.get_mut(&key.worker_id))
        {
            e.status.refused = Some(reason.to_owned());
        }
    }

    pub(crate) fn heard(&self, key: &AgentKey, now_ms: u64) {
        if let Some(e) = self
            .map
            .write()
            .get_mut(&key.model)
            .and_then(|m| m.get_mut(&key.worker_id))
        {
            e.last_heard_ms = now_ms;
        }
    }

    pub(crate) fn set_block_size(&self, key: &AgentKey, bs: u32) {
        if let Some(e) = self
            .map
            .write()
            .get_mut(&key.model)
            .and_then(|m| m.get_mut(&key.worker_id))
        {
            e.status.block_size = bs;
        }
    }

    pub(crate) fn set_load(&self, key: &AgentKey, l: &v1::Load) {
        if let Some(e) = self
            .map
            .write()
            .get_mut(&key.model)
            .and_then(|m| m.get_mut(&key.worker_id))
        {
            e.status.load = Some(EngineLoad {
                running: l.running,
                waiting: l.waiting,
                kv_usage: l.kv_usage.clamp(0.0, 1.0),
            });
            e.status.engine_up = Some(l.engine_up);
            e.load_at_ms = e.last_heard_ms;
        }
    }

    pub(crate) fn applied(&self, key: &AgentKey, seq: u64, _now_ms: u64, snapshot: bool) {
        if let Some(e) = self
            .map
            .write()
            .get_mut(&key.model)
            .and_then(|m| m.get_mut(&key.worker_id))
        {
            e.status.last_seq = Some(seq);
            if snapshot {
                e.status.snapshots += 1;
            }
        }
    }

    pub(crate) fn lag(&self, key: &AgentKey, seconds: f64) {
        if let Some(e) = self
            .map
            .write()
            .get_mut(&key.model)
            .and_then(|m| m.get_mut(&key.worker_id))
        {
            e.status.lag_ms = Some(seconds * 1000.0);
        }
    }

    /// Status of every agent of pool `model`, sorted by worker id.
    pub fn status(&self, model: &str, now_ms: u64) -> Vec<AgentStatus> {
        let mut v: Vec<AgentStatus> = self
            .map
            .read()
            .get(model)
            .into_iter()
            .flat_map(|m| m.values())
            .map(|e| AgentStatus {
                last_heard_ms_ago: now_ms.saturating_sub(e.last_heard_ms),
                ..e.status.clone()
            })
            .collect();
        v.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        v
    }

    /// Status of one agent.
    pub fn status_of(&self, model: &str, worker_id: &str, now_ms: u64) -> Option<AgentStatus> {
        let map = self.map.read();
        map.get(model)?.get(worker_id).map(|e| AgentStatus {
            last_heard_ms_ago: now_ms.saturating_sub(e.last_heard_ms),
            ..e.status.clone()
        })
    }
}

impl crate::AgentLoads for Agents {
    fn engine_load(&self, model: &str, worker_id: &str) -> Option<EngineLoad> {
        let now = crate::monotonic_ms();
        let map = self.map.read();
        let e = map.get(model)?.get(worker_id)?;
        let fresh =
            e.status.engine_up != Some(false) && now.saturating_sub(e.load_at_ms) <= LOAD_FRESH_MS;
        fresh.then_some(e.status.load).flatten()
    }
}
