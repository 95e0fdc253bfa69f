//! Publishing the simulated prefix cache's events exactly like vLLM, through
//! the agent crate's real [`KvEventPublisher`] (ZMQ PUB + ROUTER replay): map
//! form (vLLM >= 0.24) by default, the positional array form (<= 0.23) by
//! flag; hashes as uint64, the `cache_salt` in block 0's `extra_keys`.
//!
//! One task per instance owns the publisher and sends the batches in order;
//! it ends when the engine drops its sender or on shutdown.

use crate::error::BenchError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use warmpath_core::prefix_cache::CacheEvent;
use warmpath_vllm_events::{KvEvent, KvEventPublisher, PayloadForm, PublisherConfig};

/// Event batches that may wait for the publisher.
pub const QUEUE: usize = 1024;

/// Which wire form the events take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventForm {
    /// `type`-tagged maps (vLLM >= 0.24).
    #[default]
    Map,
    /// Positional arrays (vLLM <= 0.23).
    Array,
}

/// The bound endpoints of a running publisher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    /// PUB endpoint.
    pub events: String,
    /// Replay (ROUTER) endpoint.
    pub replay: Option<String>,
}

/// Binds a publisher and starts the task that feeds it; returns the sender
/// the engine writes batches to.
pub async fn start(
    endpoint: &str,
    replay: Option<&str>,
    topic: &str,
    form: EventForm,
    shutdown: CancellationToken,
) -> Result<(mpsc::Sender<Vec<CacheEvent>>, Endpoints), BenchError> {
    let mut cfg = PublisherConfig::new(endpoint);
    cfg.replay_endpoint = replay.map(str::to_owned);
    cfg.topic = topic.to_owned();
    cfg.form = match form {
        EventForm::Map => PayloadForm::Map,
        EventForm::Array => PayloadForm::Array,
    };
    let publisher = KvEventPublisher::bind(cfg)
        .await
        .map_err(|e| BenchError::Component {
            what: format!("kv event publisher on {endpoint}"),
            reason: e.to_string(),
        })?;
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
            let n = batch.len() as u64;
            match publisher
                .publish(batch.iter().map(KvEvent::from).collect())
                .await
            {
                Ok(_) => metrics::counter!("warmpath_sim_kv_events_total").increment(n),
                Err(e) => {
                    metrics::counter!("warmpath_sim_kv_events_dropped_total").increment(n);
                    tracing::warn!(error = %e, "publishing kv events failed");
                }
            }
        }
    });
    Ok((tx, bound))
}
