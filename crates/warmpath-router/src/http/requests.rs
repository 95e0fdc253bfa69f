//! What the router records of each request: its id, span, end-to-end duration
//! and (when `RUST_LOG` names [`ACCESS_TARGET`]) one access line.

use crate::routing::pool::Pool;

/// The access log's target: off unless `RUST_LOG` names it.
pub const ACCESS_TARGET: &str = "warmpath_router::access";

use crate::http::layer::Layer;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use metrics::Histogram;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tracing::Span;

pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const MAX_ID_LEN: usize = 128;

/// Where a proxied request went, put in its answer's extensions by the proxy.
#[derive(Clone, Debug)]
pub(crate) struct Routed {
    pub pool: Arc<Pool>,
    /// The backend's id, when one was picked.
    pub backend: Option<String>,
    /// `x-warmpath-decision` (`none` when no backend could be picked).
    pub decision: &'static str,
}

fn usable(id: &[u8]) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len()) && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// The request's id: the client's `x-request-id` when usable, else a new one.
pub(crate) fn request_id(headers: &HeaderMap) -> HeaderValue {
    if let Some(v) = headers.get(REQUEST_ID).filter(|v| usable(v.as_bytes())) {
        return v.clone();
    }
    let id = format!("{:032x}", rand::random::<u128>());
    HeaderValue::from_str(&id).unwrap_or_else(|_| unreachable!("hex digits are a valid header"))
}

/// The request's span (`request_id` in every line logged inside it).
pub(crate) fn span(id: &HeaderValue) -> Span {
    tracing::info_span!("request", request_id = %id.to_str().unwrap_or("-"))
}

/// `warmpath_request_duration_seconds{pool="-"}`: refused before a pool was known.
fn refused_duration() -> &'static Histogram {
    static H: OnceLock<Histogram> = OnceLock::new();
    H.get_or_init(|| crate::control::metrics::request_duration("-"))
}

/// What is written when a request's answer ends.
#[derive(Debug)]
pub(crate) struct Record {
    pub started: Instant,
    /// Until the answer's head was ready.
    pub head: Duration,
    pub method: Method,
    /// The request's path (without the query: it may carry anything).
    pub path: String,
    pub status: StatusCode,
    /// Set by the proxy for routed requests.
    pub routed: Option<Routed>,
    /// A proxied endpoint (counted in the duration histogram).
    pub proxied: bool,
    pub access_log: bool,
    pub span: Span,
}

/// Written when the answer's body ends or is dropped.
impl Layer for Record {
    fn span(&self) -> Option<&Span> {
        Some(&self.span)
    }

    fn end(&mut self, complete: bool) {
        let total = self.started.elapsed();
        if self.proxied {
            match &self.routed {
                Some(r) => r.pool.metrics.duration.record(total.as_secs_f64()),
                None => refused_duration().record(total.as_secs_f64()),
            }
        }
        if !self.access_log {
            return;
        }
        let _in = self.span.enter();
        let (pool, backend, decision) = match &self.routed {
            Some(r) => (r.pool.model.as_str(), r.backend.as_deref(), r.decision),
            None => ("-", None, "-"),
        };
        tracing::info!(target: ACCESS_TARGET,
            method = %self.method, path = %self.path, status = self.status.as_u16(),
            pool = %pool, backend = %backend.unwrap_or("-"), decision = %decision,
            head_ms = millis(self.head), total_ms = millis(total), complete,
            "request");
    }
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn with(id: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_bytes(id).unwrap());
        h
    }

    #[test]
    fn a_usable_client_id_is_kept() {
        assert_eq!(request_id(&with(b"abc-123_x.Y")), "abc-123_x.Y");
        let longest = "a".repeat(MAX_ID_LEN);
        assert_eq!(request_id(&with(longest.as_bytes())), longest.as_str());
    }

    #[test]
    fn an_unusable_or_missing_id_is_replaced() {
        let too_long = "a".repeat(MAX_ID_LEN + 1);
        for bad in [
            &b"has space"[..],
            b"tab\there",
            b"\xff\xfe",
            too_long.as_bytes(),
            b"",
        ] {
            let id = request_id(&with(bad));
            assert_ne!(id.as_bytes(), bad);
            assert!(usable(id.as_bytes()) && id.len() == 32, "{id:?}");
        }
        let a = request_id(&HeaderMap::new());
        let b = request_id(&HeaderMap::new());
        assert!(usable(a.as_bytes()) && a != b);
    }
}
