//! The rest of the OpenAI surface vLLM serves: a body with a prompt routes by
//! the pool's policy, the others least-outstanding (docs/router-internals.md).

use crate::api::salt::with_cache_salt;
use crate::config::Isolation;
use crate::control::metrics::Phase;
use crate::control::state::Shared;
use crate::http::error::ApiError;
use crate::http::incoming::tenant_header;
use crate::http::tenancy;
use crate::routing::route::{self, Hashing};
use axum::http::HeaderMap;
use bytes::Bytes;
use std::borrow::Cow;
use std::time::Instant;
use warmpath_core::request::surface::{Endpoint, Surface};
use warmpath_core::{TenantId, TenantSource};

/// Parses, resolves the pool and tenant, plans; returns the body to forward.
pub(crate) fn prepare(
    s: &Shared,
    endpoint: Endpoint,
    headers: &HeaderMap,
    raw: &Bytes,
    started: Instant,
) -> Result<(route::Plan, Bytes), ApiError> {
    let parsed = Surface::parse(raw, endpoint)?;
    let model = model_or_only(s, parsed.model)?;
    let target = s.pools.target(&model)?;
    let header = tenant_header(headers)?;
    let client = match &parsed.prompt {
        Some(req) => req.tenant(header)?,
        None => header
            .map(|h| TenantId::parse(h, TenantSource::Header))
            .transpose()?,
    };
    let tenant = tenancy::resolve(&target.pool.tenants, headers, client)?;
    target
        .pool
        .metrics
        .overhead(Phase::Parse, started.elapsed());
    let Some(mut req) = parsed.prompt else {
        return Ok((route::plan_least(target, tenant), raw.clone()));
    };
    // The pool's name, also when the body left `model` out.
    req.model = Cow::Owned(model);
    let mut plan = route::plan(target, tenant, &req, Hashing::WhenUseful)?;
    if endpoint == Endpoint::Responses {
        plan.learns_response = true;
        plan.follows = parsed.previous_response_id;
    }
    let prefills = matches!(endpoint, Endpoint::Embeddings | Endpoint::Responses);
    let salted = prefills && plan.target.pool.tenants.isolation == Isolation::Engine;
    let body = match (&plan.tenant, salted) {
        (Some(t), true) => with_cache_salt(raw, req.cache_salt.as_deref(), t),
        _ => raw.clone(),
    };
    Ok((plan, body))
}

/// The body's `model`, else the only pool's (as vLLM defaults).
pub(crate) fn model_or_only(s: &Shared, named: Option<String>) -> Result<String, ApiError> {
    match (named, s.pools.all.as_slice()) {
        (Some(m), _) => Ok(m),
        (None, [only]) => Ok(only.model.clone()),
        (None, _) => Err(ApiError::bad_request(
            "missing_field",
            "several models are served: give the body a top-level `model` field",
        )
        .with_param("model")),
    }
}
