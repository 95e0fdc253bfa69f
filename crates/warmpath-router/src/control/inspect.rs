//! Inspection: `GET /cache-index`, `POST /cache-index/query` (recording nothing)
//! and `GET /metrics`; hashes and counts only, unless a pool has `show_prompts`.

use crate::config::TenantsConfig;
use crate::control::state::Shared;
use crate::http::clock::monotonic_ms;
use crate::http::error::ApiError;
use crate::http::incoming::{tenant_header, Held};
use crate::http::tenancy;
use crate::routing::pool::Pool;
use crate::routing::route::{self, Hashing};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use warmpath_core::{Expect, Request, RequestError, TenantId, TenantSource};

/// Names the tenant a query answers for, as its answer's `tenant` shows it.
pub(crate) const QUERY_TENANT_HEADER: &str = "x-warmpath-tenant";

/// Warmest chains listed per pool unless `?top=` says otherwise.
pub(crate) const DEFAULT_TOP: usize = 10;

/// Query string of `GET /cache-index`.
#[derive(Debug, Deserialize)]
pub(crate) struct IndexQuery {
    /// How many warm chains to list per pool (at most 256).
    pub top: Option<usize>,
}

/// `GET /metrics`.
pub(crate) async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let Some(handle) = &s.metrics else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder not installed\n",
        )
            .into_response();
    };
    update_gauges(&s);
    handle.run_upkeep();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}

/// Refreshes the index gauges of every pool (also done on each scrape).
pub(crate) fn update_gauges(s: &Shared) {
    let now = monotonic_ms();
    for p in &s.pools.all {
        let stats = p.index.worker_stats(now);
        let count = |f: fn(&&_) -> bool| stats.iter().filter(f).count() as f64;
        for (name, value) in [
            ("warmpath_index_entries", p.index.entries() as f64),
            (
                "warmpath_index_max_entries",
                p.index_bounds.max_entries as f64,
            ),
            ("warmpath_index_bytes", p.index.estimated_bytes() as f64),
            ("warmpath_index_dead_entries", p.index.dead_entries() as f64),
            ("warmpath_stale_workers", count(|w| w.stale)),
            (
                "warmpath_index_prefix_closed_workers",
                count(|w| w.prefix_closed),
            ),
        ] {
            metrics::gauge!(name, "pool" => p.model.clone()).set(value);
        }
    }
    crate::control::caches::update_metrics(s);
}

fn pool_view(s: &Shared, p: &Pool, top: usize) -> Value {
    let now = monotonic_ms();
    let stats = p.index.worker_stats(now);
    let workers: Vec<Value> = p
        .backends()
        .iter()
        .map(|b| {
            let st = stats.iter().find(|w| w.worker_id == b.endpoint.id());
            let load = s
                .agents()
                .and_then(|a| a.engine_load(&p.model, b.endpoint.id()));
            let agent = s
                .agents
                .as_ref()
                .and_then(|a| a.status_of(&p.model, b.endpoint.id(), now));
            json!({
                "worker_id": b.endpoint.id(),
                "url": b.endpoint.url.to_string(),
                "healthy": b.health.is_healthy(),
                "in_flight": b.load.in_flight(),
                "pending_prefill_blocks": b.load.pending_prefill_blocks(),
                "blocks": st.map_or(0, |w| w.blocks),
                "cap_blocks": p.index.worker_cap(b.endpoint.slot),
                "tiers": {
                    "gpu": st.map_or(0, |w| w.gpu_blocks),
                    "cpu": st.map_or(0, |w| w.cpu_blocks),
                    "disk": st.map_or(0, |w| w.disk_blocks),
                },
                "last_event_ms_ago": st.and_then(|w| w.last_heard_ms_ago),
                "stale": st.is_some_and(|w| w.stale),
                "prefix_closed": st.is_some_and(|w| w.prefix_closed),
                "partial": agent.as_ref().is_some_and(|a| a.partial),
                "agent_load": load,
                "agent": agent,
                "adapters": b.endpoint.adapters(),
                "draining": b.load.is_draining(),
                "origin": b.endpoint.origin.to_string(),
            })
        })
        .collect();
    let chains: Vec<Value> = p
        .hot
        .top(top)
        .into_iter()
        .map(|c| {
            let m = p.index.longest_match(&c.hashes);
            let holders: Vec<Value> = m
                .workers
                .iter()
                .map(|w| {
                    json!({
                        "worker_id": p.index.worker_id(w.slot),
                        "blocks": w.blocks,
                        "gpu_blocks": w.gpu_blocks,
                        "fresh": w.fresh,
                    })
                })
                .collect();
            let routed: Vec<Value> = c
                .routed
                .iter()
                .map(|(w, n)| json!({"worker_id": w, "hits": n}))
                .collect();
            json!({
                "root": c.hashes.first().map(|h| h.to_hex()),
                "depth": c.hashes.len(),
                "hits": c.hits,
                "holders": holders,
                "routed": routed,
                // Only for a pool with `show_prompts`.
                "prompt_preview": c.preview,
            })
        })
        .collect();
    let policy = p.policy();
    json!({
        "model": p.model,
        "strategy": policy.strategy,
        "concurrency_threshold": policy.config.concurrency_threshold,
        "block_size": p.block_size,
        "tokenizer": p.tokenizer.is_some(),
        "index_entries": p.index.entries(),
        "distinct_blocks": p.index.distinct_blocks(),
        "workers": workers,
        "warmest_chains": chains,
        "discovery": p.discovery.iter().map(|d| d.status()).collect::<Vec<_>>(),
        // Stored `/v1/responses` ids whose backend is remembered.
        "response_ids": p.responses.len(),
    })
}

/// `GET /cache-index[?top=K]`.
pub(crate) async fn cache_index(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<IndexQuery>,
) -> Response {
    if let Err(e) = crate::control::access::inspect(&s, &headers) {
        return e.into_response();
    }
    let top = q.top.unwrap_or(DEFAULT_TOP);
    Json(snapshot(&s, top)).into_response()
}

/// What `GET /cache-index` answers, with the `top` warmest chains per pool.
pub(crate) fn snapshot(s: &Shared, top: usize) -> Value {
    let top = top.min(crate::routing::hot::DEFAULT_CAPACITY);
    update_gauges(s);
    let pools: Vec<Value> = s.pools.all.iter().map(|p| pool_view(s, p, top)).collect();
    let caches = crate::control::caches::report(s);
    json!({
        "uptime_s": s.started.elapsed().as_secs_f64(),
        "pools": pools,
        "hot_path_caches": caches,
    })
}

/// `POST /cache-index/query`: body as for chat or completions.
pub(crate) async fn query(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut held = Held::new(&s.bodies);
    let read = async {
        crate::control::access::inspect(&s, &headers)?;
        s.body(body, &headers, &mut held).await
    };
    let answered = match read.await {
        Ok(raw) if s.work.offloads(raw.len()) => {
            let (s2, headers2) = (Arc::clone(&s), headers.clone());
            s.work.run(move || answer(&s2, &headers2, &raw)).await
        }
        Ok(raw) => answer(&s, &headers, &raw),
        Err(e) => Err(e),
    };
    match answered {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn answer(s: &Shared, headers: &HeaderMap, raw: &[u8]) -> Result<Value, ApiError> {
    let started = Instant::now();
    let value: Value = serde_json::from_slice(raw).map_err(RequestError::InvalidJson)?;
    let req = Request::from_value(&value, Expect::Any)?;
    let target = s.pools.target(&req.model)?;
    let client = req.tenant(tenant_header(headers)?)?;
    let tenant = query_tenant(s, &target.pool.tenants, headers, client)?;
    let plan = route::plan(target, tenant, &req, Hashing::Always)?;
    let pool = &plan.target.pool;
    let loads = route::loads(&plan, s.agents(), s.replicas().map(|r| r.source));
    let workers: Vec<Value> = plan
        .policy
        .backends
        .iter()
        .zip(&loads)
        .map(|(b, l)| {
            let m = plan.matches.as_ref().and_then(|m| m.of(b.endpoint.slot));
            json!({
                "worker_id": b.endpoint.id(),
                "matched_blocks": m.map_or(0, |m| m.blocks),
                "gpu_blocks": m.map_or(0, |m| m.gpu_blocks),
                "fresh": m.is_none_or(|m| m.fresh),
                "eligible": l.eligible,
                "in_flight": l.in_flight,
            })
        })
        .collect();
    // Read-only: a preview records no placement or load.
    let decision = match route::preview(&plan, s.agents(), s.replicas().map(|r| r.source)) {
        Ok(d) => json!({
            "worker_id": plan.policy.backends[d.backend].endpoint.id(),
            "decision": d.kind,
            "matched_blocks": d.matched_blocks,
        }),
        Err(e) => json!({"error": e.message}),
    };
    let hashed = plan.matches.is_some();
    Ok(json!({
        "model": pool.model,
        "adapter": plan.target.adapter,
        "tenant": plan.tenant.as_ref().map(TenantId::as_str),
        "strategy": plan.policy.strategy,
        "block_size": pool.block_size,
        "hashed": hashed,
        "blocks": plan.hashes.len(),
        "block_hashes": plan.hashes.iter().map(|h| h.to_hex()).collect::<Vec<_>>(),
        "prefix_key": plan.prefix_key.to_string(),
        "workers": workers,
        "decision": decision,
        "router_overhead_ms": started.elapsed().as_secs_f64() * 1e3,
    }))
}

/// The tenant a query answers for: the caller's own, or with the admin token
/// any (`X-Warmpath-Tenant`): warmth is an oracle across tenants.
fn query_tenant(
    s: &Shared,
    cfg: &TenantsConfig,
    headers: &HeaderMap,
    client: Option<TenantId>,
) -> Result<Option<TenantId>, ApiError> {
    let named = match headers.get(QUERY_TENANT_HEADER) {
        None => None,
        Some(v) => {
            let raw = v.to_str().map_err(|_| {
                ApiError::bad_request(
                    "invalid_tenant",
                    "X-Warmpath-Tenant must be 1 to 64 printable ASCII characters",
                )
            })?;
            Some(TenantId::parse(raw, TenantSource::Header)?)
        }
    };
    if crate::control::access::admin_presented(s, headers) {
        return Ok(named.or(client));
    }
    let own = tenancy::resolve(cfg, headers, client)?;
    match named {
        Some(n) if own.as_ref() != Some(&n) => Err(ApiError::forbidden(
            "tenant_not_allowed",
            "a query answers for the caller's own tenant only; naming another \
             tenant (X-Warmpath-Tenant) takes the admin token",
        )),
        _ => Ok(own),
    }
}
