//! `GET /cache-index/ui`: one self-contained HTML page with `/cache-index`'s
//! JSON embedded, so it shows without a second request (docs/router-internals.md).

use crate::control::state::Shared;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The page (`src/ui/cache.html`).
const PAGE: &str = include_str!("ui/cache.html");
/// Where the snapshot goes in [`PAGE`].
const SLOT: &str = "/*SNAPSHOT*/";
/// Warmest chains shown per pool.
const TOP: usize = 20;
/// Inline script and style only, requests to this router only.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
    connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /cache-index/ui`.
pub(crate) async fn page(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(e) = crate::control::access::inspect(&s, &headers) {
        let mut resp = e.into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(
                "Basic realm=\"warmpath cache index (password: the inspect token)\", charset=\"UTF-8\"",
            ),
        );
        return resp;
    }
    let snapshot = crate::control::inspect::snapshot(&s, TOP);
    let html = render(&snapshot);
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        html,
    )
        .into_response()
}

/// The page with `snapshot` embedded as JSON that cannot end the `<script>`
/// element holding it: `<` only occurs inside JSON strings, where `\u003c`
/// means the same.
fn render(snapshot: &serde_json::Value) -> String {
    PAGE.replacen(SLOT, &snapshot.to_string().replace('<', "\\u003c"), 1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "ui_tests.rs"]
mod tests;
