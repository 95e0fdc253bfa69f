//! Who may use the admin API and the introspection endpoints.
//!
//! `PUT /admin/...` needs `admin_token` when one is set. `/cache-index`,
//! `/cache-index/query` and `/cache-index/ui` need `inspect_token` or
//! `admin_token` when either is set: the index shows which prefixes are warm
//! where, and a query costs router CPU. There the token may also come as the
//! password of HTTP Basic auth (any user name), which is what a browser
//! sends after the cache page's login prompt, and then on the page's own
//! requests. `/metrics`, `/health` and the OpenAI endpoints stay open.
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

/// The password of an `Authorization: Basic` header, if one.
fn basic_password(headers: &HeaderMap) -> Option<String> {
    use base64::Engine;
    let encoded = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?
        .trim();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let pair = String::from_utf8(decoded).ok()?;
    pair.split_once(':')
        .map(|(_, password)| password.to_owned())
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
    if set.peek().is_none() {
        return Ok(());
    }
    let basic = basic_password(headers);
    let given = |t: &str| {
        matches(headers, t)
            || basic
                .as_deref()
                .is_some_and(|p| warmpath_proto::same_token(p, t))
    };
    if set.any(given) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}
