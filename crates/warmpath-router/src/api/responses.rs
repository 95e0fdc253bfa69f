//! Stored `/v1/responses` responses, followed to the engine that holds them;
//! unknown ids are looked for on every backend, bounded against floods.

use crate::control::state::Shared;
use crate::http::clock::monotonic_ms;
use crate::http::error::ApiError;
use crate::http::incoming::{path_and_query, Held};
use crate::routing::backend::Backend;
use crate::routing::pool::{Pool, Target};
use crate::routing::proxy::{self, rejected, Outgoing};
use crate::routing::route::{self, Plan};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Request, StatusCode, Uri};
use axum::response::Response;
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use http_body_util::Full;
use std::sync::Arc;
use warmpath_core::request::surface::response_id;

/// Sets `plan.pinned` when the request continues a stored response.
pub(crate) async fn follow(s: &Shared, plan: &mut Plan) {
    let Some(id) = plan.follows.as_deref() else {
        return;
    };
    let pool = &plan.target.pool;
    let (outcome, holder) = find(s, pool, id).await;
    crate::control::metrics::response_affinity(&pool.model, outcome);
    if holder.is_none() {
        tracing::debug!(pool = %pool.model, response = id, outcome,
            "no serving backend holds the response this request continues");
    }
    plan.pinned = holder;
}

/// The serving backend of `pool` holding response `id`, and how it was found.
async fn find(s: &Shared, pool: &Pool, id: &str) -> (&'static str, Option<String>) {
    let backends = pool.policy().backends.clone();
    let remembered = pool.responses.holder(id);
    if let Some(w) = &remembered {
        if backends.iter().any(|b| b.endpoint.id() == w && serving(b)) {
            return ("known", remembered);
        }
    }
    let now = monotonic_ms();
    if pool.responses.missed(id, now) {
        return ("unknown", None);
    }
    let wait = s.config.health.probe_timeout();
    let Some(_turn) = pool.responses.lookup_turn(wait).await else {
        tracing::debug!(pool = %pool.model, response = id,
            "too many response look-ups under way; taken as unknown");
        return ("unknown", None);
    };
    match locate(s, &backends, id).await {
        Some(w) => {
            pool.responses.remember(id, &w);
            ("located", Some(w))
        }
        None => {
            pool.responses.miss(id, monotonic_ms());
            match remembered {
                Some(_) => ("gone", None),
                None => ("unknown", None),
            }
        }
    }
}

fn serving(b: &Backend) -> bool {
    b.health.is_healthy() && !b.load.is_draining()
}

/// The first serving backend answering `GET /v1/responses/{id}` with a success.
async fn locate(s: &Shared, backends: &[Arc<Backend>], id: &str) -> Option<String> {
    let path = format!("/v1/responses/{id}");
    let mut asked: FuturesUnordered<_> = backends
        .iter()
        .filter(|b| serving(b))
        .map(|b| {
            let path = &path;
            async move {
                let ok = status_of(s, b, path).await?.is_success();
                ok.then(|| b.endpoint.id().to_owned())
            }
        })
        .collect();
    while let Some(found) = asked.next().await {
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The status of `GET path` on `b` (the body is not read), within the probe timeout.
async fn status_of(s: &Shared, b: &Backend, path: &str) -> Option<StatusCode> {
    let timeout = s.config.health.probe_timeout();
    let mut req = Request::builder()
        .method(Method::GET)
        .uri(b.endpoint.url.join(path).ok()?)
        .body(Full::new(Bytes::new()))
        .ok()?;
    b.endpoint
        .authorize(req.headers_mut(), s.upstream.auth.as_ref());
    let resp = tokio::time::timeout(timeout, s.upstream.client.request(req))
        .await
        .ok()?
        .ok()?;
    Some(resp.status())
}

/// `GET /v1/responses/{id}`.
pub(crate) async fn get(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    relay(s, Method::GET, &id, "", &uri, &headers, Bytes::new()).await
}

/// `POST /v1/responses/{id}/cancel`.
pub(crate) async fn cancel(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut held = Held::new(&s.bodies);
    let raw = match s.body(body, &headers, &mut held).await {
        Ok(b) => b,
        Err(e) => return rejected(e),
    };
    relay(s, Method::POST, &id, "/cancel", &uri, &headers, raw).await
}

/// Sends the request to the backend holding response `id`.
async fn relay(
    s: Arc<Shared>,
    method: Method,
    id: &str,
    suffix: &str,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let id = match response_id(id, "response_id") {
        Ok(id) => id,
        Err(e) => return rejected(ApiError::from(e).with_param("response_id")),
    };
    let mut held = None;
    for pool in &s.pools.all {
        let (outcome, holder) = find(&s, pool, &id).await;
        crate::control::metrics::response_affinity(&pool.model, outcome);
        if let Some(w) = holder {
            held = Some((Arc::clone(pool), w));
            break;
        }
    }
    let Some((pool, worker)) = held else {
        let message = format!(
            "Response with id '{id}' not found: no backend of this router holds it \
             (stored responses live in the memory of the engine that made them)"
        );
        let e = ApiError::new(StatusCode::NOT_FOUND, "response_not_found", message);
        return rejected(e.with_param("response_id"));
    };
    let target = Target {
        pool,
        adapter: None,
    };
    let mut plan = route::plan_least(target, None);
    plan.pinned = Some(worker);
    let pq = path_and_query(&format!("/v1/responses/{id}{suffix}"), uri);
    let out = Outgoing {
        method,
        path_and_query: &pq,
        headers,
        body,
    };
    proxy::forward(&s.upstream, s.agents(), s.replicas(), &plan, out).await
}
