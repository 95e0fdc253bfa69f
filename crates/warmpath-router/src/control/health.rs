//! Active health checks, spread over `probe_interval_ms`, and adapter and
//! model card discovery from `/v1/models` (docs/router-internals.md).

use crate::config::ProbeKind;
use crate::control::readiness;
use crate::control::state::Shared;
use crate::http::clock::monotonic_ms;
use crate::routing::backend::Backend;
use crate::routing::pool::Pool;
use axum::http::{header, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The longest back-off is this many times the first: a fixed engine returns without an operator.
const EJECT_MAX_DOUBLINGS: u64 = 24;

/// Largest probe or `/v1/models` answer read.
const MAX_MODELS_BYTES: usize = 1 << 20;

/// Runs the probes every interval until `shutdown`, each round [`spread`] over it.
pub(crate) async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let every = Duration::from_millis(shared.config.health.probe_interval_ms);
    let mut next = tokio::time::Instant::now() + every;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        let started = tokio::time::Instant::now();
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = spread(&shared, every) => {}
        }
        // A round that overran is followed at once.
        next = (started + every).max(tokio::time::Instant::now());
    }
}

/// One round with backend `k` of `n` probed `k × every / n` after its start
/// (all at once for zero), then `warmpath_ready` updated.
pub(crate) async fn spread(shared: &Shared, every: Duration) {
    let mut members = Vec::new();
    for p in &shared.pools.all {
        members.extend(p.backends().iter().map(|b| (Arc::clone(p), Arc::clone(b))));
    }
    let n = u32::try_from(members.len()).unwrap_or(u32::MAX).max(1);
    let start = tokio::time::Instant::now();
    let probes = members.iter().enumerate().map(|(k, (p, b))| async move {
        let k = u32::try_from(k).unwrap_or(u32::MAX);
        tokio::time::sleep_until(start + every / n * k).await;
        let before = (b.health.is_healthy(), b.health.is_verified());
        probe(shared, p, b).await;
        if (b.health.is_healthy(), b.health.is_verified()) != before {
            readiness::update_gauge(shared);
        }
    });
    futures::future::join_all(probes).await;
    readiness::update_gauge(shared);
}

/// What one probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Fail,
    /// Proves nothing either way (see [`ProbeKind::Completion`]).
    Inconclusive,
}

pub(crate) async fn probe(shared: &Shared, pool: &Pool, b: &Arc<Backend>) {
    let h = &shared.config.health;
    let ejected = !b.health.is_healthy();
    if ejected
        && monotonic_ms()
            < b.health.readmit_at_ms(
                h.first_ejection_ms(),
                h.first_ejection_ms().saturating_mul(EJECT_MAX_DOUBLINGS),
            )
    {
        return;
    }
    let serving = h.probe == ProbeKind::Completion;
    match check(shared, pool, b).await {
        Verdict::Pass => {
            if b.probe_passed(serving) {
                tracing::info!(pool = %pool.model, backend = %b.endpoint.id(), "backend healthy again");
            }
        }
        Verdict::Fail if !ejected => {
            let _one_at_a_time = pool.ejecting.lock();
            let room = || pool.room_to_eject(h.max_ejection_percent);
            if b.failed_within(true, h.eject_after, room) {
                tracing::warn!(pool = %pool.model, backend = %b.endpoint.id(), probe = ?h.probe,
                    "backend ejected after repeated failed probes");
            }
        }
        Verdict::Fail | Verdict::Inconclusive => return,
    }
    if b.health.is_healthy() {
        if let Some((status, body)) = send(shared, b, "/v1/models", None).await {
            if let Some(cards) = cards_of(&body, &pool.model).filter(|_| status.is_success()) {
                b.endpoint
                    .set_learned_adapters(adapters_of(&cards, &pool.model));
                if let Some(n) = max_model_len_of(&cards, &pool.model) {
                    pool.learn_context_length(n);
                }
                b.endpoint.set_learned_cards(cards);
            }
        }
    }
}

async fn check(shared: &Shared, pool: &Pool, b: &Backend) -> Verdict {
    let answer = match shared.config.health.probe {
        ProbeKind::Health => send(shared, b, "/health", None).await,
        ProbeKind::Completion => {
            let body = completion_probe(&pool.model);
            let busy_before = b.load.in_flight() > 0;
            let a = send(shared, b, "/v1/completions", Some(body)).await;
            if a.is_none() && (busy_before || b.load.in_flight() > 0) {
                return Verdict::Inconclusive;
            }
            a
        }
    };
    match answer {
        Some((status, _)) if status.is_success() => Verdict::Pass,
        // The engine answered and wants credentials: alive.
        Some((StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN, _)) => {
            if !b.endpoint.warned_credentials() {
                tracing::warn!(pool = %pool.model, backend = %b.endpoint.id(),
                    "the engine asks for credentials: set upstream.api_key (WARMPATH_UPSTREAM_API_KEY)");
            }
            Verdict::Pass
        }
        _ => Verdict::Fail,
    }
}

/// A completion probe: one token after a prompt shorter than a KV block (no cache left).
pub(crate) fn completion_probe(model: &str) -> Bytes {
    Bytes::from(
        json!({"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0,
               "stream": false})
        .to_string(),
    )
}

fn id_of(card: &Value) -> Option<&str> {
    card.get("id").and_then(Value::as_str)
}

/// The LoRA adapters among a pool's cards: those whose `parent` is `model`.
pub(crate) fn adapters_of(cards: &[Value], model: &str) -> BTreeSet<String> {
    cards
        .iter()
        .filter(|c| c.get("parent").and_then(Value::as_str) == Some(model))
        .filter_map(id_of)
        .filter(|id| *id != model)
        .map(str::to_owned)
        .collect()
}

/// vLLM's `max_model_len` on the card of `model` among a pool's cards.
pub(crate) fn max_model_len_of(cards: &[Value], model: &str) -> Option<usize> {
    let card = cards.iter().find(|c| id_of(c) == Some(model))?;
    let n = card.get("max_model_len")?.as_u64()?;
    usize::try_from(n).ok().filter(|&n| n > 0)
}

/// One probe exchange (a GET, or a POST of `json_body`), read to its end within the probe timeout.
async fn send(
    shared: &Shared,
    b: &Backend,
    path: &str,
    json_body: Option<Bytes>,
) -> Option<(StatusCode, Bytes)> {
    let mut req = Request::builder().uri(b.endpoint.url.join(path).ok()?);
    if json_body.is_some() {
        req = req
            .method(Method::POST)
            .header(header::CONTENT_TYPE, "application/json");
    }
    let mut req = req.body(Full::new(json_body.unwrap_or_default())).ok()?;
    b.endpoint
        .authorize(req.headers_mut(), shared.upstream.auth.as_ref());
    let fetch = async {
        let resp = shared.upstream.client.request(req).await.ok()?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_MODELS_BYTES)
            .collect()
            .await
            .ok()?
            .to_bytes();
        Some((status, body))
    };
    let timeout = shared.config.health.probe_timeout();
    tokio::time::timeout(timeout, fetch).await.ok().flatten()
}

/// The cards of pool `model` (its own and its adapters') in a `/v1/models` answer.
pub(crate) fn cards_of(body: &[u8], model: &str) -> Option<Vec<Value>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let data = v.get("data")?.as_array()?;
    Some(
        data.iter()
            .filter(|c| id_of(c).is_some_and(|id| !id.is_empty()))
            .filter(|c| {
                id_of(c) == Some(model) || c.get("parent").and_then(Value::as_str) == Some(model)
            })
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "health_tests.rs"]
mod tests;
