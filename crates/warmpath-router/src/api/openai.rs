//! The OpenAI-compatible generation endpoints (`/v1/chat/completions`,
//! `/v1/completions`) and the native `/invocations`.

use crate::api::salt::with_cache_salt;
use crate::api::surface::{self, model_or_only};
use crate::config::{Isolation, TenantFrom};
use crate::control::metrics::Phase;
use crate::control::state::Shared;
use crate::http::error::ApiError;
use crate::http::incoming::{path_and_query, tenant_header, Held};
use crate::http::tenancy;
use crate::routing::pool::Target;
use crate::routing::proxy::{self, rejected, Outgoing};
use crate::routing::route::{self, Hashing};
use axum::body::Body;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;
use warmpath_core::request::surface::Endpoint;
use warmpath_core::{Expect, Request, TenantId, TenantSource};

/// The proxied endpoints' paths (the same on the router and the engine).
const CHAT_PATH: &str = "/v1/chat/completions";
const COMPLETIONS_PATH: &str = "/v1/completions";
const INVOCATIONS_PATH: &str = "/invocations";

/// The proxied POST endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proxied {
    /// Chat or completions.
    OpenAi(Expect),
    Invocations,
    /// Embeddings, responses, tokenize, ... ([`crate::api::surface`]).
    Surface(Endpoint),
}

impl Proxied {
    /// The endpoint at exactly this path.
    pub(crate) fn of_path(path: &str) -> Option<Self> {
        match path {
            CHAT_PATH => Some(Proxied::OpenAi(Expect::Chat)),
            COMPLETIONS_PATH => Some(Proxied::OpenAi(Expect::Completion)),
            INVOCATIONS_PATH => Some(Proxied::Invocations),
            p => Endpoint::of_path(p).map(Proxied::Surface),
        }
    }

    fn path(self) -> &'static str {
        match self {
            Proxied::OpenAi(Expect::Chat) => CHAT_PATH,
            Proxied::OpenAi(_) => COMPLETIONS_PATH,
            Proxied::Invocations => INVOCATIONS_PATH,
            Proxied::Surface(e) => e.path(),
        }
    }

    /// Parses, resolves the pool and tenant, plans; returns the body to forward.
    fn prepare(
        self,
        s: &Shared,
        headers: &HeaderMap,
        raw: &Bytes,
        started: Instant,
    ) -> Result<(route::Plan, Bytes), ApiError> {
        match self {
            Proxied::OpenAi(expect) => prepare(s, expect, headers, raw, started),
            Proxied::Invocations => prepare_raw(s, headers, raw, started),
            Proxied::Surface(e) => surface::prepare(s, e, headers, raw, started),
        }
    }
}

/// Reads the body, plans the request (big ones on the work pool) and forwards it.
pub(crate) async fn serve(
    s: Arc<Shared>,
    proxied: Proxied,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // Held until the body has gone upstream (the answer's head is in).
    let mut held = Held::new(&s.bodies);
    let raw = match s.body(body, &headers, &mut held).await {
        Ok(b) => b,
        Err(e) => return rejected(e),
    };
    let started = Instant::now();
    let prepared = if s.work.offloads(raw.len()) {
        let (s2, headers2) = (Arc::clone(&s), headers.clone());
        s.work
            .run(move || proxied.prepare(&s2, &headers2, &raw, started))
            .await
    } else {
        proxied.prepare(&s, &headers, &raw, started)
    };
    let (mut plan, forward_body) = match prepared {
        Ok(x) => x,
        Err(e) => return rejected(e),
    };
    crate::api::responses::follow(&s, &mut plan).await;
    let pq = match proxied {
        Proxied::Invocations => INVOCATIONS_PATH.to_owned(),
        _ => path_and_query(proxied.path(), &uri),
    };
    let out = Outgoing {
        method: axum::http::Method::POST,
        path_and_query: &pq,
        headers: &headers,
        body: forward_body,
    };
    proxy::forward(&s.upstream, s.agents(), s.replicas(), &plan, out).await
}

/// Parses, resolves the pool and tenant, plans; returns the body to forward.
fn prepare(
    s: &Shared,
    expect: Expect,
    headers: &HeaderMap,
    raw: &Bytes,
    started: Instant,
) -> Result<(route::Plan, Bytes), ApiError> {
    let req = Request::parse(raw, expect)?;
    let target = s.pools.target(&req.model)?;
    let client = req.tenant(tenant_header(headers)?)?;
    let tenant = tenancy::resolve(&target.pool.tenants, headers, client)?;
    target
        .pool
        .metrics
        .overhead(Phase::Parse, started.elapsed());
    let plan = route::plan(target, tenant, &req, Hashing::WhenUseful)?;
    let salted = plan.target.pool.tenants.isolation == Isolation::Engine;
    let body = match (&plan.tenant, salted) {
        (Some(t), true) => with_cache_salt(raw, req.cache_salt.as_deref(), t),
        _ => raw.clone(),
    };
    Ok((plan, body))
}

/// The top-level fields `/invocations` reads (nothing else is built).
#[derive(Debug, Default, Deserialize)]
struct Native<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    prompt_cache_key: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
}

/// `POST /invocations`, the native API: the body goes as sent (but for an
/// API-key tenant's `cache_salt`), to the pool its `model` names, else the only one.
fn prepare_raw(
    s: &Shared,
    headers: &HeaderMap,
    raw: &Bytes,
    started: Instant,
) -> Result<(route::Plan, Bytes), ApiError> {
    let native = serde_json::from_slice::<Native<'_>>(raw).ok();
    let fields = native.as_ref();
    let model = model_or_only(
        s,
        fields.and_then(|n| n.model.as_deref()).map(str::to_owned),
    )?;
    let target: Target = s.pools.target(&model)?;
    let named = [
        (tenant_header(headers)?, TenantSource::Header),
        (
            fields.and_then(|n| n.prompt_cache_key.as_deref()),
            TenantSource::PromptCacheKey,
        ),
        (
            fields.and_then(|n| n.cache_salt.as_deref()),
            TenantSource::CacheSalt,
        ),
    ];
    let client = named
        .into_iter()
        .find_map(|(v, src)| v.map(|v| TenantId::parse(v, src)))
        .transpose()?;
    let tenant = tenancy::resolve(&target.pool.tenants, headers, client)?;
    target
        .pool
        .metrics
        .overhead(Phase::Parse, started.elapsed());
    // Only a tenant from the API key (a promise of isolation) salts the native body.
    let tenants = &target.pool.tenants;
    let salted = tenants.isolation == Isolation::Engine && tenants.from == TenantFrom::ApiKey;
    let body = match (&tenant, salted, fields) {
        (Some(t), true, Some(n)) => with_cache_salt(raw, n.cache_salt.as_deref(), t),
        (Some(_), true, None) => {
            return Err(ApiError::bad_request(
                "invalid_json",
                "tenants are isolated in the engine: a request with a tenant takes a JSON object body, \
                 so that its cache_salt can be set",
            ))
        }
        _ => raw.clone(),
    };
    Ok((route::plan_raw(target, tenant, &model, raw), body))
}
