//! The simulated cache's events, published as vLLM does through the agent
//! crate's [`KvEventPublisher`] (one task per instance, batches in order).

use crate::error::{component, BenchError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use warmpath_core::prefix_cache::CacheEvent;
use warmpath_vllm_events::{KvEvent, KvEventPublisher, PublisherConfig};

/// Event batches that may wait for the publisher.
pub const QUEUE: usize = 1024;

/// The bound endpoints of a running publisher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub events: String,
    pub replay: Option<String>,
}

/// Binds a publisher and starts the task that feeds it; returns the sender
/// the engine writes batches to.
pub async fn start(
    replay: bool,
    shutdown: CancellationToken,
) -> Result<(mpsc::Sender<Vec<CacheEvent>>, Endpoints), BenchError> {
    let endpoint = "tcp://127.0.0.1:0";
    let mut cfg = PublisherConfig::new(endpoint);
    cfg.replay_endpoint = replay.then(|| endpoint.to_owned());
    let publisher = KvEventPublisher::bind(cfg)
        .await
        .map_err(|e| component(format!("kv event publisher on {endpoint}"), e))?;
    let bound = Endpoints {
        events: publisher.endpoint().to_owned(),
        replay: publisher.replay_endpoint().map(str::to_owned),
    };
    let (tx, mut rx) = mpsc::channel::<Vec<CacheEvent>>(QUEUE);
    tokio::spawn(async move {
        loop {
            let batch = tokio::select! {
                _ = shutdown.cancelled() => break,
                b = rx.recv() => match b { Some(b) => b, None => break },
            };
            let events = batch.iter().map(KvEvent::from).collect();
            if let Err(e) = publisher.publish(events).await {
                tracing::warn!(error = %e, "publishing kv events failed");
            }
        }
    });
    Ok((tx, bound))
}
