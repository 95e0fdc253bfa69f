//! Shared by the pipeline benches: the router's real gRPC ingest
//! (`warmpath_router::ingest`) over one pool's real `CacheIndex`, on
//! 127.0.0.1, and the publisher + in-process agent feeding it.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use warmpath_agent::{Agent, AgentConfig};
use warmpath_core::CacheIndex;
use warmpath_router::config::RouterConfig;
use warmpath_router::ingest::{self, Agents, IngestPool, PoolDirectory};
use warmpath_vllm_events::{KvEventPublisher, PublisherConfig};

struct OnePool(IngestPool);

impl PoolDirectory for OnePool {
    fn pool(&self, model: &str) -> Option<IngestPool> {
        (model == self.0.model).then(|| self.0.clone())
    }
    fn pools(&self) -> Vec<IngestPool> {
        vec![self.0.clone()]
    }
}

/// The router side: ingest server + sweeper over pool "m".
pub(crate) struct Ingest {
    pub url: String,
    pub index: Arc<CacheIndex>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Ingest {
    pub(crate) async fn start(block_size: usize) -> Ingest {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let index = Arc::new(CacheIndex::new());
        let dir: Arc<dyn PoolDirectory> = Arc::new(OnePool(IngestPool {
            model: "m".into(),
            index: index.clone(),
            block_size,
            known_workers: None,
            bounds: Default::default(),
        }));
        let stop = CancellationToken::new();
        let tasks = ingest::spawn(
            listener,
            dir,
            Arc::new(Agents::default()),
            &RouterConfig::default(),
            stop.clone(),
        )
        .unwrap();
        Ingest {
            url,
            index,
            stop,
            tasks,
        }
    }

    /// Blocks the index holds for `worker`.
    pub(crate) fn blocks(&self, worker: &str) -> u64 {
        self.index
            .worker_slot(worker)
            .map_or(0, |s| self.index.block_count(s))
    }

    pub(crate) async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// A vLLM-compatible publisher and an agent "w" following it, publishing to
/// `router`; returns once the router has applied the agent's first snapshot.
pub(crate) async fn publisher_and_agent(ingest: &Ingest) -> (KvEventPublisher, Agent) {
    let mut pc = PublisherConfig::new("tcp://127.0.0.1:0");
    pc.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    let p = KvEventPublisher::bind(pc).await.unwrap();
    let mut c = AgentConfig::new("w", "m", "http://127.0.0.1:9", p.endpoint());
    c.kv_replay = p.replay_endpoint().map(str::to_owned);
    c.routers = vec![ingest.url.clone()];
    c.load_interval = Duration::ZERO;
    let agent = Agent::start(c, None).await.unwrap();
    // Warm up until the subscriber hears us and the router knows the worker.
    while agent.stats().batches.get() == 0 || ingest.index.worker_slot("w").is_none() {
        p.publish(vec![]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (p, agent)
}
