//! What the router knows of each agent (epoch, owning stream, sequence, lag,
//! engine load), read by routing and by `/cache-index`.

use parking_lot::RwLock;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use warmpath_core::EngineLoad;
use warmpath_proto::v1;

use crate::routing::loads::EngineCell;

/// (model, worker id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AgentKey {
    pub(crate) model: String,
    pub(crate) worker_id: String,
}

/// One agent's status, as `/cache-index` shows it.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct AgentStatus {
    pub worker_id: String,
    /// The engine URL the agent announced.
    pub endpoint: String,
    /// The agent run (epoch) currently publishing.
    pub epoch: u64,
    /// Tokens per block the agent learned from its engine (0 = not yet).
    pub block_size: u32,
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
    /// Whether the agent's view misses blocks its engine holds.
    pub partial: bool,
    /// Why the router last refused this agent, until a stream of it is accepted.
    pub refused: Option<String>,
}

/// Stands for "none" in [`Live`]'s atomics.
const NONE: u64 = u64::MAX;

/// The owner of a worker removed from its pool: no stream owns it.
const REMOVED: u64 = u64::MAX;

/// The part of an entry every message updates, in atomics (no registry lock
/// on the hot path); a stream that takes the worker over reuses it.
#[derive(Debug)]
pub(crate) struct Live {
    /// The stream publishing now (0: none; stream ids start at 1).
    owner: AtomicU64,
    last_heard_ms: AtomicU64,
    last_seq: AtomicU64,
    lag_us: AtomicU64,
    snapshots: AtomicU64,
    /// The pace clock of the worker's replacements, kept across its streams.
    replaced_ms: AtomicU64,
}

impl Live {
    fn new() -> Self {
        Live {
            owner: AtomicU64::new(0),
            last_heard_ms: AtomicU64::new(0),
            last_seq: AtomicU64::new(NONE),
            lag_us: AtomicU64::new(NONE),
            snapshots: AtomicU64::new(0),
            replaced_ms: AtomicU64::new(NONE),
        }
    }

    /// The pace clock of the worker's replacements (see [`super::pace`]).
    pub(crate) fn replaced_at(&self) -> Option<u64> {
        Self::some(&self.replaced_ms)
    }

    /// The worker's set is being replaced: its pace clock moves to `tat`.
    pub(crate) fn replaced(&self, tat: u64) {
        self.replaced_ms.store(tat, Ordering::Relaxed);
    }

    pub(crate) fn owned_by(&self, id: u64) -> bool {
        self.owner.load(Ordering::Acquire) == id
    }

    /// Whether the worker was removed from its pool (see [`Agents::remove_worker`]).
    pub(crate) fn removed(&self) -> bool {
        self.owner.load(Ordering::Acquire) == REMOVED
    }

    pub(crate) fn heard(&self, now_ms: u64) {
        self.last_heard_ms.store(now_ms, Ordering::Relaxed);
    }

    /// A snapshot or delta up to `seq` was applied.
    pub(crate) fn applied(&self, seq: u64, snapshot: bool) {
        self.last_seq.store(seq, Ordering::Relaxed);
        if snapshot {
            self.snapshots.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Event-to-index lag of the latest delta.
    pub(crate) fn lag(&self, seconds: f64) {
        self.lag_us
            .store((seconds * 1e6).min(1e15) as u64, Ordering::Relaxed);
    }

    fn some(v: &AtomicU64) -> Option<u64> {
        Some(v.load(Ordering::Relaxed)).filter(|v| *v != NONE)
    }
}

#[derive(Debug)]
struct Entry {
    /// The fields that change rarely (under the registry's write lock).
    status: AgentStatus,
    live: Arc<Live>,
    /// Its engine load and whether the engine is up (routing's boards read it).
    cell: Arc<EngineCell>,
}

impl Entry {
    fn view(&self, now_ms: u64) -> AgentStatus {
        let l = &self.live;
        AgentStatus {
            connected: l.owner.load(Ordering::Acquire) != 0,
            last_seq: Live::some(&l.last_seq),
            snapshots: l.snapshots.load(Ordering::Relaxed),
            lag_ms: Live::some(&l.lag_us).map(|us| us as f64 / 1000.0),
            last_heard_ms_ago: now_ms.saturating_sub(l.last_heard_ms.load(Ordering::Relaxed)),
            load: self.cell.last(),
            engine_up: self.cell.engine_up(),
            ..self.status.clone()
        }
    }
}

/// Every agent known to this router.
#[derive(Debug, Default)]
pub struct Agents {
    /// model -> worker id -> entry (nested so reads can look up by `&str`).
    map: RwLock<HashMap<String, HashMap<String, Entry>>>,
    next_stream: AtomicU64,
    /// Bumped whenever a worker's entry (and so its [`EngineCell`]) comes or goes.
    generation: AtomicU64,
    /// Decision sharing with the other router replicas, over these streams.
    pub(crate) peers: Arc<crate::ingest::peers::Peers>,
}

impl Agents {
    /// Gives the worker to a new stream; refuses an older epoch only while the
    /// known one's stream is up (a restart with its clock behind gets in).
    pub(crate) fn claim(
        &self,
        key: &AgentKey,
        hello: &v1::Hello,
        now_ms: u64,
    ) -> Result<(u64, Arc<Live>), String> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed) + 1;
        let mut all = self.map.write();
        let map = all.entry(key.model.clone()).or_default();
        if let Some(e) = map.get(&key.worker_id) {
            if hello.epoch < e.status.epoch && e.live.owner.load(Ordering::Acquire) != 0 {
                return Err(format!(
                    "epoch {} is older than the epoch {} already publishing for worker {}",
                    hello.epoch, e.status.epoch, key.worker_id
                ));
            }
        }
        let prev = map.remove(&key.worker_id);
        let same_epoch = prev.as_ref().is_some_and(|p| p.status.epoch == hello.epoch);
        let live = prev
            .as_ref()
            .map_or_else(|| Arc::new(Live::new()), |p| Arc::clone(&p.live));
        let cell = match &prev {
            Some(p) => {
                p.cell.claimed(same_epoch);
                Arc::clone(&p.cell)
            }
            None => {
                self.generation.fetch_add(1, Ordering::AcqRel);
                Arc::new(EngineCell::default())
            }
        };
        live.owner.store(id, Ordering::Release);
        live.last_heard_ms.store(now_ms, Ordering::Relaxed);
        live.last_seq.store(NONE, Ordering::Relaxed);
        live.lag_us.store(NONE, Ordering::Relaxed);
        let status = AgentStatus {
            worker_id: key.worker_id.clone(),
            endpoint: hello.endpoint.clone(),
            epoch: hello.epoch,
            block_size: hello.block_size,
            connected: true,
            partial: hello.partial,
            ..AgentStatus::default()
        };
        map.insert(
            key.worker_id.clone(),
            Entry {
                status,
                live: Arc::clone(&live),
                cell,
            },
        );
        Ok((id, live))
    }

    /// Forgets a worker removed from pool `model` (its stream is refused next).
    pub fn remove_worker(&self, model: &str, worker_id: &str) -> bool {
        let mut all = self.map.write();
        let Some(e) = all.get_mut(model).and_then(|m| m.remove(worker_id)) else {
            return false;
        };
        e.live.owner.store(REMOVED, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Stream `stream` ended; the worker is disconnected unless taken over.
    pub(crate) fn disconnect(&self, key: &AgentKey, stream: u64) {
        let all = self.map.read();
        if let Some(e) = all.get(&key.model).and_then(|m| m.get(&key.worker_id)) {
            let _ = e
                .live
                .owner
                .compare_exchange(stream, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Runs `f` on the entry of a known agent (unknown ones are never added).
    fn update(&self, key: &AgentKey, f: impl FnOnce(&mut Entry)) {
        let mut all = self.map.write();
        if let Some(e) = all
            .get_mut(&key.model)
            .and_then(|m| m.get_mut(&key.worker_id))
        {
            f(e);
        }
    }

    /// Records why a known agent's stream was refused (refusals never grow the registry).
    pub(crate) fn refused(&self, key: &AgentKey, reason: &str) {
        self.update(key, |e| e.status.refused = Some(reason.to_owned()));
    }

    pub(crate) fn set_block_size(&self, key: &AgentKey, bs: u32) {
        self.update(key, |e| e.status.block_size = bs);
    }

    pub(crate) fn set_load(&self, key: &AgentKey, l: &v1::Load) {
        self.update(key, |e| {
            let load = EngineLoad {
                running: l.running,
                waiting: l.waiting,
                kv_usage: l.kv_usage.clamp(0.0, 1.0),
                capacity_blocks: (l.capacity_blocks > 0).then_some(l.capacity_blocks),
            };
            e.status.partial = l.partial;
            let at = e.live.last_heard_ms.load(Ordering::Relaxed);
            e.cell.set(load, l.engine_up, at);
        });
    }

    /// Status of one agent.
    pub fn status_of(&self, model: &str, worker_id: &str, now_ms: u64) -> Option<AgentStatus> {
        let map = self.map.read();
        map.get(model)?.get(worker_id).map(|e| e.view(now_ms))
    }
}

impl crate::routing::loads::AgentLoads for Agents {
    fn cell_generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn engine_cell(&self, model: &str, worker_id: &str) -> Option<Arc<EngineCell>> {
        let map = self.map.read();
        map.get(model)?.get(worker_id).map(|e| Arc::clone(&e.cell))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::{BackendConfig, BackendUrl};
    use crate::http::clock::monotonic_ms;
    use crate::routing::backend::{Backend, Origin};
    use crate::routing::loads::{AgentLoads, Board};

    fn hello(epoch: u64) -> v1::Hello {
        v1::Hello {
            worker_id: "w1".into(),
            endpoint: "http://127.0.0.1:1".into(),
            model: "m".into(),
            block_size: 16,
            epoch,
            agent_version: "test".into(),
            dp_rank: 0,
            partial: false,
        }
    }

    fn load(running: u32, engine_up: bool) -> v1::Load {
        v1::Load {
            running,
            waiting: 0,
            kv_usage: 0.5,
            engine_up,
            capacity_blocks: 0,
            partial: false,
        }
    }

    /// What a board of worker `w1`'s backend reads now.
    fn read(a: &Agents, board: &Board, b: &[Arc<Backend>]) -> Option<u32> {
        let now = monotonic_ms();
        board.with("m", b, Some(a), now, true, |l, _| {
            l[0].engine.map(|e| e.running)
        })
    }

    #[test]
    fn a_boards_cell_follows_claims_reports_and_removal() {
        let a = Agents::default();
        let key = AgentKey {
            model: "m".into(),
            worker_id: "w1".into(),
        };
        let cfg = BackendConfig {
            url: "http://127.0.0.1:1".into(),
            worker_id: Some("w1".into()),
            api_key: None,
        };
        let url = BackendUrl::parse(&cfg.url).unwrap();
        let b = [Arc::new(Backend::new("m", &cfg, url, 0, Origin::Config))];
        let board = Board::default();
        assert_eq!(read(&a, &board, &b), None, "no agent yet");
        a.claim(&key, &hello(1), monotonic_ms()).unwrap();
        assert_eq!(read(&a, &board, &b), None, "claimed, nothing reported");
        a.set_load(&key, &load(3, true));
        assert_eq!(read(&a, &board, &b), Some(3));
        assert_eq!(a.engine_load("m", "w1").unwrap().running, 3);
        let st = a.status_of("m", "w1", monotonic_ms()).unwrap();
        assert_eq!((st.load.unwrap().running, st.engine_up), (3, Some(true)));
        a.set_load(&key, &load(4, false));
        assert_eq!(read(&a, &board, &b), None, "engine down");
        a.set_load(&key, &load(5, true));
        // A reconnect of the same run keeps the load; up is unknown again.
        a.claim(&key, &hello(1), monotonic_ms()).unwrap();
        assert_eq!(read(&a, &board, &b), Some(5));
        assert_eq!(a.status_of("m", "w1", 0).unwrap().engine_up, None);
        // A new run forgets it.
        a.claim(&key, &hello(2), monotonic_ms()).unwrap();
        assert_eq!(read(&a, &board, &b), None);
        a.set_load(&key, &load(6, true));
        assert_eq!(read(&a, &board, &b), Some(6));
        // Removed: the handle is dropped; claimed anew: the new cell is found.
        assert!(a.remove_worker("m", "w1"));
        assert_eq!(read(&a, &board, &b), None);
        a.claim(&key, &hello(3), monotonic_ms()).unwrap();
        a.set_load(&key, &load(7, true));
        assert_eq!(read(&a, &board, &b), Some(7));
    }
}
