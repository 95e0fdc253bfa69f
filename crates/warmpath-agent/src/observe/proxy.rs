//! The sidecar proxy: every request goes to the engine as it came, and the
//! engine's answer comes back as it went (status, headers, body chunk by chunk;
//! nothing is decompressed or re-encoded). Hop-by-hop headers are not
//! forwarded, `content-length` is recomputed.
//!
//! A client that leaves drops the response stream, which drops the engine
//! connection, so the engine stops generating for it.

use super::{ObserveStats, Observed, QueueBudget};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use warmpath_core::Expect;

/// The tenant header the router reads too.
const TENANT_HEADER: &str = "x-prefix-aware-id";

/// What the proxy handler needs.
#[derive(Debug, Clone)]
pub struct ProxyState {
    /// HTTP client to the engine.
    pub client: reqwest::Client,
    /// Engine base URL without a trailing `/`, e.g. `http://127.0.0.1:8000`.
    pub engine_url: String,
    /// Where accepted prompts go to be mirrored.
    pub observe_tx: mpsc::Sender<Observed>,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// The observation queue's byte budget.
    pub queue: QueueBudget,
    /// How long a client may take to send its body (408 beyond).
    pub body_timeout: Duration,
    /// Counters.
    pub stats: Arc<ObserveStats>,
}

/// A router that proxies every request not matched by another route.
pub fn proxy_router(state: ProxyState) -> Router {
    Router::new().fallback(forward).with_state(state)
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

fn copy_headers(from: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(from.len());
    for (k, v) in from {
        if !is_hop_by_hop(k) {
            out.append(k.clone(), v.clone());
        }
    }
    out
}

fn error(status: StatusCode, kind: &str, message: String) -> Response {
    let body =
        serde_json::json!({"error": {"message": message, "type": kind, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

/// Which observed endpoint a request is for, if any.
fn observed_kind(method: &Method, path: &str) -> Option<Expect> {
    if method != Method::POST {
        return None;
    }
    match path {
        "/v1/chat/completions" => Some(Expect::Chat),
        "/v1/completions" => Some(Expect::Completion),
        _ => None,
    }
}

async fn forward(State(s): State<ProxyState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or_else(|| path.clone(), |pq| pq.as_str().to_owned());
    let read = tokio::time::timeout(s.body_timeout, axum::body::to_bytes(body, s.max_body_bytes));
    let body = match read.await {
        Ok(Ok(b)) => b,
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "request body not received within {} ms",
                    s.body_timeout.as_millis()
                ),
            )
        }
        Ok(Err(e)) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "request body unreadable or over {} bytes: {e}",
                    s.max_body_bytes
                ),
            )
        }
    };
    let kind = observed_kind(&parts.method, &path);
    let tenant_header = parts
        .headers
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    s.stats.forwarded.inc();
    let upstream = s
        .client
        .request(
            parts.method.clone(),
            format!("{}{path_and_query}", s.engine_url),
        )
        .headers(copy_headers(&parts.headers))
        .body(body.clone())
        .send()
        .await;
    let resp = match upstream {
        Ok(r) => r,
        Err(e) => {
            s.stats.engine_errors.inc();
            metrics::counter!("warmpath_agent_proxy_engine_errors_total").increment(1);
            tracing::warn!(error = %e, %path, "engine unreachable");
            return error(
                StatusCode::BAD_GATEWAY,
                "engine_unavailable",
                format!("the engine at {} did not answer: {e}", s.engine_url),
            );
        }
    };
    let status = resp.status();
    metrics::counter!("warmpath_agent_proxy_requests_total", "status" => status.as_str().to_owned())
        .increment(1);
    if let (Some(expect), true) = (kind, status.is_success()) {
        let queued = s
            .queue
            .observe(body, expect, tenant_header)
            .map(|obs| s.observe_tx.try_send(obs));
        if !matches!(queued, Some(Ok(()))) {
            s.stats.dropped.inc();
            metrics::counter!("warmpath_agent_observe_dropped_total").increment(1);
            tracing::warn!("observer queue full: a prompt was not mirrored");
        }
    }
    let mut out = Response::builder().status(status);
    if let Some(h) = out.headers_mut() {
        *h = copy_headers(resp.headers());
    }
    match out.body(Body::from_stream(resp.bytes_stream())) {
        Ok(r) => r,
        Err(e) => error(
            StatusCode::BAD_GATEWAY,
            "engine_unavailable",
            format!("the engine's response could not be relayed: {e}"),
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::http::header;

    #[test]
    fn only_posts_to_the_two_openai_endpoints_are_observed() {
        assert_eq!(
            observed_kind(&Method::POST, "/v1/chat/completions"),
            Some(Expect::Chat)
        );
        assert_eq!(
            observed_kind(&Method::POST, "/v1/completions"),
            Some(Expect::Completion)
        );
        assert_eq!(observed_kind(&Method::GET, "/v1/completions"), None);
        assert_eq!(observed_kind(&Method::POST, "/invocations"), None);
    }

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        h.insert(header::HOST, header::HeaderValue::from_static("agent"));
        h.insert(
            header::CONTENT_LENGTH,
            header::HeaderValue::from_static("3"),
        );
        h.insert(
            header::AUTHORIZATION,
            header::HeaderValue::from_static("Bearer k"),
        );
        h.insert(TENANT_HEADER, header::HeaderValue::from_static("acme"));
        let out = copy_headers(&h);
        assert_eq!(out.len(), 2);
        assert!(out.contains_key(header::AUTHORIZATION) && out.contains_key(TENANT_HEADER));
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_answered_408() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (tx, _rx) = mpsc::channel(4);
        let state = ProxyState {
            client: reqwest::Client::new(),
            engine_url: "http://127.0.0.1:9".into(),
            observe_tx: tx,
            max_body_bytes: 1 << 20,
            queue: QueueBudget::new(1 << 20),
            body_timeout: Duration::from_millis(200),
            stats: Arc::new(ObserveStats::default()),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, proxy_router(state)).await.unwrap();
        });
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
        let mut buf = vec![0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("answered")
            .unwrap();
        let head = String::from_utf8_lossy(&buf[..n]);
        assert!(head.starts_with("HTTP/1.1 408"), "{head}");
        server.abort();
    }
}
