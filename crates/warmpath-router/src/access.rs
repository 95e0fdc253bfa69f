//! Who may use the admin API and the introspection endpoints.
//!
//! `PUT /admin/...` needs `admin_token` when one is set. `/cache-index` and
//! `/cache-index/query` need `inspect_token` or `admin_token` when either is
//! set: the index shows which prefixes are warm where, and a query costs
//! router CPU. `/metrics`, `/health` and the OpenAI endpoints stay open.
//! A query answers for the caller's own tenant only, unless it presents the
//! admin token ([`admin_presented`]; see `inspect`).
//! With no token, validation refuses a listener other hosts can reach
//! unless `insecure` is set (`config::validate`).

use crate::error::ApiError;
use crate::state::Shared;
use axum::http::{header, HeaderMap};

/// The `Authorization: Bearer` token, if one (also the `tenants.from:
/// api_key` key).
pub fn presented(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

fn matches(headers: &HeaderMap, token: &str) -> bool {
    presented(headers).is_some_and(|given| warmpath_proto::same_token(given, token))
}

/// `Ok` when `headers` may use the admin API.
pub fn admin(s: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    match &s.settings.admin_token {
        Some(t) if !matches(headers, t) => Err(ApiError::unauthorized()),
        _ => Ok(()),
    }
}

/// Whether `headers` present the admin token (never when none is set): what
/// lets a query answer for another tenant.
pub fn admin_presented(s: &Shared, headers: &HeaderMap) -> bool {
    s.settings
        .admin_token
        .as_deref()
        .is_some_and(|t| matches(headers, t))
}

/// `Ok` when `headers` may read the cache index.
pub fn inspect(s: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let tokens = [&s.settings.inspect_token, &s.settings.admin_token];
    let mut set = tokens.iter().filter_map(|t| t.as_deref()).peekable();
    if set.peek().is_none() || set.any(|t| matches(headers, t)) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}
