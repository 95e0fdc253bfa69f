//! Run-time control: `PUT /admin/pools/{model}/strategy` and config reload,
//! both swapping a pool's policy atomically ([`Pool::switch`]).

use crate::config::RouterConfig;
use crate::control::members;
use crate::control::state::Shared;
use crate::http::error::{method_not_allowed, ApiError, RouterError};
use crate::http::incoming::{read_body, Held};
use crate::routing::backend::Origin;
use crate::routing::pool::{Pool, SwitchError};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use warmpath_core::Strategy;

/// Every `/admin/pools/{*rest}` request.
pub(crate) async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    Path(rest): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // The token before the body: no anonymous client holds a connection open.
    if let Err(e) = crate::control::access::admin(&s, &headers) {
        return e.into_response();
    }
    let mut held = Held::new(&s.bodies);
    let timeout = s.config.server.body_timeout();
    let body = match read_body(body, &headers, MAX_ADMIN_BODY, timeout, &mut held).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let models: Vec<&str> = s.pools.all.iter().map(|p| p.model.as_str()).collect();
    let Some(res) = members::resource(&rest, &models) else {
        let named = rest
            .split_once("/backends")
            .or_else(|| rest.rsplit_once("/strategy"));
        return match named {
            Some((m, _)) if !models.contains(&m) => ApiError::unknown_model(m).into_response(),
            _ => ApiError::new(StatusCode::NOT_FOUND, "not_found", format!(
                "no admin resource /admin/pools/{rest}; use /admin/pools/{{model}}/strategy or /admin/pools/{{model}}/backends"
            ))
            .into_response(),
        };
    };
    let (members::Resource::Strategy(m)
    | members::Resource::Backends(m)
    | members::Resource::Backend(m, _)
    | members::Resource::Drain(m, _)) = res;
    // `resource` names only the pools' models.
    let Some(p) = s.pools.get(m).cloned() else {
        return ApiError::unknown_model(m).into_response();
    };
    match (res, method) {
        (members::Resource::Strategy(_), Method::PUT) => set_strategy(&p, &body),
        (members::Resource::Strategy(_), _) => method_not_allowed("PUT"),
        (members::Resource::Backends(_), Method::GET) => {
            Json(members::list(&s, &p)).into_response()
        }
        (members::Resource::Backends(_), Method::POST) => members::add(&s, &p, &body).await,
        (members::Resource::Backends(_), _) => method_not_allowed("GET, POST"),
        (members::Resource::Backend(_, w), Method::DELETE) => match members::remove(&s, &p, w) {
            Ok(b) => Json(json!({"model": p.model, "worker_id": b.endpoint.id(), "removed": true}))
                .into_response(),
            Err(e) => e.response(),
        },
        (members::Resource::Backend(..), _) => method_not_allowed("DELETE"),
        (members::Resource::Drain(_, w), Method::POST) => members::drain_request(&s, &p, w, &body),
        (members::Resource::Drain(..), _) => method_not_allowed("POST"),
    }
}

/// The largest admin body: a backend, a strategy or a drain deadline.
const MAX_ADMIN_BODY: usize = 64 * 1024;

/// Body of `PUT /admin/pools/{model}/strategy`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StrategyBody {
    strategy: String,
}

/// `PUT /admin/pools/{model}/strategy`, after [`handle`] checked the token.
fn set_strategy(pool: &Pool, body: &[u8]) -> Response {
    let req: StrategyBody = match members::json_body(body, r#"{"strategy": "..."}"#) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let strategy: Strategy = match req.strategy.parse() {
        Ok(st) => st,
        Err(e) => {
            return ApiError::bad_request("invalid_strategy", format!("{e}"))
                .with_param("strategy")
                .into_response()
        }
    };
    let config = pool.policy().config.clone();
    match pool.switch(strategy, config) {
        Ok(previous) => Json(json!({
            "model": pool.model,
            "strategy": strategy,
            "previous": previous,
        }))
        .into_response(),
        Err(e @ SwitchError::NeedsTokenizer(_)) => {
            ApiError::new(StatusCode::CONFLICT, "needs_tokenizer", e.to_string())
                .with_param("strategy")
                .into_response()
        }
        Err(e) => ApiError::bad_request("invalid_strategy", e.to_string()).into_response(),
    }
}

/// What a reload applied and what it could not (each a sentence).
#[derive(Debug, Default)]
pub(crate) struct ReloadReport {
    /// Applied live.
    pub applied: Vec<String>,
    /// Left as they run: they need a restart (or a different change).
    pub ignored: Vec<String>,
}

/// Applies a re-read configuration's strategies and configured backends;
/// settings that need a restart are listed, not applied (docs/discovery.md).
pub(crate) async fn reload(
    s: &Arc<Shared>,
    config: &RouterConfig,
) -> Result<ReloadReport, RouterError> {
    config.validate()?;
    let mut r = ReloadReport::default();
    for pc in &config.pools {
        let model = &pc.model;
        let Some(pool) = s.pools.get(model) else {
            r.ignored
                .push(format!("pool {model:?} is new: needs a restart"));
            continue;
        };
        let current = pool.policy();
        let (strategy, knobs) = (pc.effective_strategy(), pc.policy_config());
        if current.strategy != strategy || current.config != knobs {
            pool.switch(strategy, knobs)
                .map_err(|e| e.into_router_error(model))?;
            let from = current.strategy;
            r.applied
                .push(format!("pool {model:?}: policy {from} -> {strategy}"));
        }
        reload_members(s, pool, pc, &mut r).await;
        let running: Vec<_> = pool.discovery.iter().map(|p| &p.config).collect();
        let changed = [
            (
                "discovery",
                pc.discovery.iter().collect::<Vec<_>>() != running,
            ),
            ("block_size", pc.block_size != pool.block_size),
            (
                "expose_routing_headers, max_prompt_tokens or show_prompts",
                pc.expose_routing_headers != pool.expose_routing_headers
                    || pc.max_prompt_tokens != pool.max_prompt_tokens
                    || pc.show_prompts != pool.show_prompts,
            ),
        ];
        for (what, _) in changed.iter().filter(|(_, c)| *c) {
            r.ignored
                .push(format!("pool {model:?}: {what} changed: needs a restart"));
        }
    }
    for p in &s.pools.all {
        let model = &p.model;
        if !config.pools.iter().any(|pc| pc.model == *model) {
            r.ignored.push(format!(
                "pool {model:?} is gone from the configuration: needs a restart"
            ));
        }
    }
    Ok(r)
}

/// The backend part of a reload: adds first, so the pool is never empty.
async fn reload_members(
    s: &Arc<Shared>,
    pool: &Arc<Pool>,
    pc: &crate::config::PoolConfig,
    r: &mut ReloadReport,
) {
    let (model, members) = (&pc.model, pool.backends());
    for b in &pc.backends {
        let id = b.id();
        match members.iter().find(|m| m.endpoint.id() == id) {
            None => match members::add_member(s, pool, b, Origin::Config).await {
                Ok(_) => r
                    .applied
                    .push(format!("pool {model:?}: backend {id:?} added")),
                Err(e) => r
                    .ignored
                    .push(format!("pool {model:?}: backend {id:?} not added: {e}")),
            },
            Some(m) if m.endpoint.origin == Origin::Config && m.endpoint.configured != *b => {
                r.ignored.push(format!(
                    "pool {model:?}: backend {id:?} changed its url: remove it and add it again"
                ))
            }
            Some(_) => {}
        }
    }
    for m in members
        .iter()
        .filter(|m| m.endpoint.origin == Origin::Config)
    {
        let id = m.endpoint.id();
        if m.load.is_draining() || pc.backends.iter().any(|b| b.id() == id) {
            continue;
        }
        match members::drain(s, pool, id, members::DEFAULT_DRAIN_TIMEOUT) {
            Ok(_) => r.applied.push(format!(
                "pool {model:?}: backend {id:?} draining (gone from the configuration)"
            )),
            Err(e) => r
                .ignored
                .push(format!("pool {model:?}: backend {id:?} not removed: {e}")),
        }
    }
}

/// The process-wide settings a re-read configuration changes (a reload cannot).
pub(crate) fn restart_only_changes(running: &RouterConfig, new: &RouterConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |name: &str, changed: bool| {
        if changed {
            out.push(format!("{name} changed: needs a restart"));
        }
    };
    check("listen", running.listen != new.listen);
    check("grpc_listen", running.grpc_listen != new.grpc_listen);
    check("admin_token", running.admin_token != new.admin_token);
    check("inspect_token", running.inspect_token != new.inspect_token);
    check("agent_secret", running.agent_secret != new.agent_secret);
    check("ingest", running.ingest != new.ingest);
    check(
        "max_body_bytes",
        running.max_body_bytes != new.max_body_bytes,
    );
    check("health", running.health != new.health);
    check("server", running.server != new.server);
    check("upstream", running.upstream != new.upstream);
    check("insecure", running.insecure != new.insecure);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_wide_changes_are_listed_not_applied() {
        let running = RouterConfig::default();
        assert!(restart_only_changes(&running, &running.clone()).is_empty());
        let mut new = running.clone();
        new.listen = "127.0.0.1:1".into();
        new.agent_secret = Some("t".into());
        new.ingest.stale_after_ms += 1;
        let changes = restart_only_changes(&running, &new);
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert!(changes[0].starts_with("listen changed"));
        assert!(changes[2].starts_with("ingest changed"));
    }
}
