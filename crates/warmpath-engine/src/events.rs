//! Publishing the prefix cache's events like vLLM: the worker thread queues each
//! batch; one task owns the publisher, sends them in order, and ends with the engine.

use crate::engine::{EventSink, NoEvents};
use crate::error::EngineError;
use tokio::sync::mpsc;
use warmpath_core::prefix_cache::CacheEvent;
use warmpath_vllm_events::publisher::{KvEventPublisher, PublisherConfig};
use warmpath_vllm_events::KvEvent;

/// Batches that may wait for the publisher before the worker blocks.
const QUEUE: usize = 1024;

#[derive(Debug)]
pub struct ZmqSink {
    tx: mpsc::Sender<Vec<KvEvent>>,
}

impl EventSink for ZmqSink {
    fn publish(&mut self, events: Vec<CacheEvent>) {
        let batch = events.iter().map(KvEvent::from).collect();
        // Called from the worker thread: wait for room rather than lose events.
        if self.tx.blocking_send(batch).is_err() {
            metrics::counter!("warmpath_engine_kv_events_dropped_total").increment(1);
            tracing::error!("kv-event publisher task has stopped; events lost");
        }
    }
}

/// The bound endpoints of a running publisher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    /// PUB endpoint, port resolved.
    pub events: String,
    /// Replay endpoint, port resolved.
    pub replay: Option<String>,
}

/// Binds the publisher (if `endpoint` is given) and returns the sink for the
/// engine plus the bound endpoints. Without an endpoint, events are dropped.
pub async fn start(
    endpoint: Option<&str>,
    replay: Option<&str>,
    topic: &str,
) -> Result<(Box<dyn EventSink>, Option<Endpoints>), EngineError> {
    let Some(endpoint) = endpoint else {
        return Ok((Box::new(NoEvents), None));
    };
    let mut cfg = PublisherConfig::new(endpoint);
    cfg.replay_endpoint = replay.map(str::to_owned);
    cfg.topic = topic.to_owned();
    let publisher = KvEventPublisher::bind(cfg)
        .await
        .map_err(|e| EngineError::Events(e.to_string()))?;
    let bound = Endpoints {
        events: publisher.endpoint().to_owned(),
        replay: publisher.replay_endpoint().map(str::to_owned),
    };
    let (tx, mut rx) = mpsc::channel::<Vec<KvEvent>>(QUEUE);
    tokio::spawn(async move {
        while let Some(batch) = rx.recv().await {
            let n = batch.len() as u64;
            match publisher.publish(batch).await {
                Ok(_) => metrics::counter!("warmpath_engine_kv_events_total").increment(n),
                Err(e) => {
                    metrics::counter!("warmpath_engine_kv_events_dropped_total").increment(1);
                    tracing::warn!(error = %e, "publishing kv events failed");
                }
            }
        }
        tracing::debug!("kv-event publisher stopped: the engine is gone");
    });
    Ok((Box::new(ZmqSink { tx }), Some(bound)))
}
