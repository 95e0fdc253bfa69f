//! Run-time control: `PUT /admin/pools/{model}/strategy` and config reload.
//!
//! Both swap a pool's policy atomically ([`Pool::switch`](crate::pool::Pool::switch)):
//! requests already routed keep their backend, requests being routed finish
//! with the snapshot they took, later requests use the new policy.

use crate::config::RouterConfig;
use crate::error::{ApiError, RouterError};
use crate::pool::SwitchError;
use crate::state::Shared;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use warmpath_core::Strategy;

/// Body of `PUT /admin/pools/{model}/strategy`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyBody {
    /// The new strategy.
    pub strategy: String,
}

/// `PUT /admin/pools/{model}/strategy` (`model` may contain `/`).
pub async fn set_strategy(
    State(s): State<Arc<Shared>>,
    Path(rest): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = crate::access::admin(&s, &headers) {
        return e.into_response();
    }
    let Some(model) = rest.strip_suffix("/strategy") else {
        return ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "no admin resource /admin/pools/{rest}; use /admin/pools/{{model}}/strategy"
            ),
            kind: "invalid_request_error",
            param: None,
            code: "not_found",
        }
        .into_response();
    };
    let Some(pool) = s.pools.get(model) else {
        return ApiError::unknown_model(model).into_response();
    };
    let req: StrategyBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return ApiError::bad_request(
                "invalid_json",
                format!("body must be {{\"strategy\": \"...\"}}: {e}"),
            )
            .into_response()
        }
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
        Err(e @ SwitchError::NeedsTokenizer(_)) => ApiError {
            status: StatusCode::CONFLICT,
            message: e.to_string(),
            kind: "invalid_request_error",
            param: Some("strategy".into()),
            code: "needs_tokenizer",
        }
        .into_response(),
        Err(e) => ApiError::bad_request("invalid_strategy", e.to_string()).into_response(),
    }
}

/// Applies a re-read configuration: each existing pool gets the file's
/// strategy and policy knobs. Returns what changed; settings that need a
/// restart (backends, tokenizer, block size, listen addresses, new pools)
/// are logged and listed, not applied.
pub fn reload(s: &Shared, config: &RouterConfig) -> Result<Vec<String>, RouterError> {
    config.validate()?;
    let mut changes = Vec::new();
    for pc in &config.pools {
        let Some(pool) = s.pools.get(&pc.model) else {
            changes.push(format!(
                "pool {:?} is new: needs a restart (ignored)",
                pc.model
            ));
            continue;
        };
        let current = pool.policy();
        let (strategy, knobs) = (pc.effective_strategy(), pc.policy_config());
        if current.strategy != strategy || current.config != knobs {
            pool.switch(strategy, knobs).map_err(|e| match e {
                SwitchError::Policy(source) => RouterError::Policy {
                    model: pc.model.clone(),
                    source,
                },
                SwitchError::NeedsTokenizer(m) => RouterError::Config(crate::config::invalid(
                    format!("pool {m:?}"),
                    "kv_aware needs a tokenizer, and tokenizers load only at start",
                )),
            })?;
            changes.push(format!(
                "pool {:?}: policy {} -> {}",
                pc.model, current.strategy, strategy
            ));
        }
        let ids: Vec<&str> = pc.backends.iter().map(|b| b.id()).collect();
        let have: Vec<&str> = pool.backends.iter().map(|b| b.id.as_str()).collect();
        if ids != have || pc.block_size != pool.block_size {
            changes.push(format!(
                "pool {:?}: backends or block_size changed: needs a restart (ignored)",
                pc.model
            ));
        }
        if pc.expose_routing_headers != pool.expose_routing_headers
            || pc.max_prompt_tokens != pool.configured_prompt_cap()
            || pc.show_prompts != pool.show_prompts
        {
            changes.push(format!(
                "pool {:?}: expose_routing_headers, max_prompt_tokens or show_prompts changed: needs a restart (ignored)",
                pc.model
            ));
        }
    }
    for c in &changes {
        tracing::info!("reload: {c}");
    }
    Ok(changes)
}

/// The process-wide settings that differ between the running configuration
/// and a re-read one: a reload cannot apply them (listeners, tokens, ingest
/// TLS and deadlines, limits, health checks, the upstream client).
pub fn restart_only_changes(running: &RouterConfig, new: &RouterConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |name: &str, changed: bool| {
        if changed {
            out.push(format!("{name} changed: needs a restart (ignored)"));
        }
    };
    check("listen", running.listen != new.listen);
    check("grpc_listen", running.grpc_listen != new.grpc_listen);
    check("admin_token", running.admin_token != new.admin_token);
    check("inspect_token", running.inspect_token != new.inspect_token);
    check("agent_token", running.agent_token != new.agent_token);
    check("agent_secret", running.agent_secret != new.agent_secret);
    check("ingest", running.ingest != new.ingest);
    check(
        "max_body_bytes",
        running.max_body_bytes != new.max_body_bytes,
    );
    check(
        "forward_cache_salt",
        running.forward_cache_salt != new.forward_cache_salt,
    );
    check("health", running.health != new.health);
    check("server", running.server != new.server);
    check("upstream", running.upstream != new.upstream);
    check("work", running.work != new.work);
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
        new.agent_token = Some("t".into());
        new.ingest.stale_after_ms += 1;
        let changes = restart_only_changes(&running, &new);
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert!(changes[0].starts_with("listen changed"));
        assert!(changes[2].starts_with("ingest changed"));
    }
}
