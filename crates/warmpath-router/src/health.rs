//! Active health checks and LoRA adapter discovery.
//!
//! Every `probe_interval_ms`, for every backend: an ejected backend is
//! probed with `GET /health` and returns to rotation on a 2xx; a healthy one
//! (when `learn_adapters` is on) is asked `GET /v1/models`, and every model
//! card whose `parent` (vLLM's field for LoRA modules) is the pool's model is
//! recorded as an adapter it serves. Ejection itself is passive: repeated
//! failures of proxied requests (see [`crate::proxy`]).

use crate::backend::Backend;
use crate::pool::Pool;
use crate::state::Shared;
use axum::http::{Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Largest `/v1/models` answer read.
const MAX_MODELS_BYTES: usize = 1 << 20;

/// Runs the probes until `shutdown`.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let h = shared.settings.health.clone();
    let mut tick = tokio::time::interval(Duration::from_millis(h.probe_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let probes: Vec<_> = shared
            .pools
            .all()
            .iter()
            .flat_map(|p| p.backends.iter().map(move |b| (p, b)))
            .map(|(p, b)| probe(&shared, p, b, h.learn_adapters))
            .collect();
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = futures::future::join_all(probes) => {}
        }
    }
}

async fn probe(shared: &Shared, pool: &Pool, b: &Arc<Backend>, learn: bool) {
    let timeout = Duration::from_millis(shared.settings.health.probe_timeout_ms);
    if !b.is_healthy() {
        match get(shared, b, "/health", timeout).await {
            Some((status, _)) if status.is_success() => {
                if b.probe_passed() {
                    tracing::info!(pool = %pool.model, backend = %b.id, "backend healthy again");
                }
            }
            _ => return,
        }
    }
    if learn {
        if let Some((status, body)) = get(shared, b, "/v1/models", timeout).await {
            if status.is_success() {
                if let Some(adapters) = adapters_of(&body, &pool.model) {
                    b.set_learned_adapters(adapters);
                }
                if let Some(n) = max_model_len_of(&body, &pool.model) {
                    pool.learn_context_length(n);
                }
            }
        }
    }
}

/// The LoRA adapters in a `/v1/models` answer: cards whose `parent` is `model`.
pub fn adapters_of(body: &[u8], model: &str) -> Option<BTreeSet<String>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let data = v.get("data")?.as_array()?;
    Some(
        data.iter()
            .filter(|c| c.get("parent").and_then(Value::as_str) == Some(model))
            .filter_map(|c| c.get("id").and_then(Value::as_str))
            .filter(|id| *id != model && !id.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// vLLM's `max_model_len` on the card of `model` in a `/v1/models` answer.
pub fn max_model_len_of(body: &[u8], model: &str) -> Option<usize> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let card = v
        .get("data")?
        .as_array()?
        .iter()
        .find(|c| c.get("id").and_then(Value::as_str) == Some(model))?;
    let n = card.get("max_model_len")?.as_u64()?;
    usize::try_from(n).ok().filter(|&n| n > 0)
}

async fn get(
    shared: &Shared,
    b: &Backend,
    path: &str,
    timeout: Duration,
) -> Option<(StatusCode, Bytes)> {
    let req = Request::builder()
        .method(Method::GET)
        .uri(b.url.join(path).ok()?)
        .body(Full::new(Bytes::new()))
        .ok()?;
    let fetch = async {
        let resp = shared.client.request(req).await.ok()?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_MODELS_BYTES)
            .collect()
            .await
            .ok()?
            .to_bytes();
        Some((status, body))
    };
    tokio::time::timeout(timeout, fetch).await.ok().flatten()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn adapters_are_the_cards_parented_by_the_model() {
        let body = br#"{"object":"list","data":[
            {"id":"m","object":"model","parent":null},
            {"id":"sql","object":"model","parent":"m"},
            {"id":"other","object":"model","parent":"x"}]}"#;
        let a = adapters_of(body, "m").unwrap();
        assert_eq!(a.into_iter().collect::<Vec<_>>(), ["sql"]);
        assert!(adapters_of(b"not json", "m").is_none());
    }

    #[test]
    fn the_context_length_is_the_models_own_card() {
        let body = br#"{"data":[{"id":"sql","max_model_len":99,"parent":"m"},
            {"id":"m","max_model_len":4096}]}"#;
        assert_eq!(max_model_len_of(body, "m"), Some(4096));
        assert_eq!(max_model_len_of(br#"{"data":[{"id":"m"}]}"#, "m"), None);
        assert_eq!(
            max_model_len_of(br#"{"data":[{"id":"m","max_model_len":0}]}"#, "m"),
            None
        );
    }
}
