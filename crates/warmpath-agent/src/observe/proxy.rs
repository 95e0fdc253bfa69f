//! The sidecar proxy: every request goes to the engine as it came, and the
//! engine's answer comes back as it went (status, headers, body chunk by chunk;
//! nothing is decompressed or re-encoded). Hop-by-hop headers and those
//! `Connection` names are not forwarded ([`warmpath_edge::headers`]),
//! `content-length` is recomputed.
//!
//! A client that leaves drops the response stream, which drops the engine
//! connection, so the engine stops generating for it.

use super::budget::{ByteBudget, Held, Observed};
use super::stats::ObserveStats;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use warmpath_core::Expect;
use warmpath_edge::{ErrorBody, ErrorCode};

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
    pub queue: ByteBudget,
    /// The byte budget of request bodies being read or forwarded, over
    /// every connection (503 beyond: the agent is busy, not the engine).
    pub bodies: ByteBudget,
    /// How long a client may take to send its body (408 beyond).
    pub body_timeout: Duration,
    /// Counters.
    pub stats: Arc<ObserveStats>,
}

/// A router that proxies every request not matched by another route.
pub fn proxy_router(state: ProxyState) -> Router {
    Router::new().fallback(forward).with_state(state)
}

/// Headers the proxy sets itself on either side: `host` is the engine's,
/// and the body's length is known again once read (reqwest and hyper set it).
const OWN_HEADERS: [HeaderName; 2] = [header::HOST, header::CONTENT_LENGTH];

/// The end-to-end headers of `from`, minus [`OWN_HEADERS`].
fn copy_headers(from: &HeaderMap) -> HeaderMap {
    warmpath_edge::end_to_end(from, &OWN_HEADERS)
}

/// An answer of the agent's own, in the OpenAI shape with vLLM's numeric
/// `code`.
fn error(status: StatusCode, kind: &str, message: String) -> Response {
    let body = ErrorBody {
        message: &message,
        kind,
        param: None,
        code: ErrorCode::Status(status),
    };
    (status, axum::Json(body.json())).into_response()
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
    let (body, _held) = match read_body(body, &s).await {
        Ok(read) => read,
        Err(fault) => return fault.answer(&s),
    };
    let kind = observed_kind(&parts.method, &path);
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
        let queued = Observed::within(&s.queue, body, expect).map(|obs| s.observe_tx.try_send(obs));
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

/// Why a request body was not read whole.
#[derive(Debug)]
enum BodyFault {
    /// Not all of it within `body_timeout`.
    Late,
    /// Over `max_body_bytes`, or the connection failed mid-body.
    Unreadable(String),
    /// Every connection's bodies together would pass the `bodies` budget.
    Busy,
}

impl BodyFault {
    fn answer(&self, s: &ProxyState) -> Response {
        match self {
            BodyFault::Late => error(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "request body not received within {} ms",
                    s.body_timeout.as_millis()
                ),
            ),
            BodyFault::Unreadable(why) => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "request body unreadable or over {} bytes: {why}",
                    s.max_body_bytes
                ),
            ),
            BodyFault::Busy => {
                metrics::counter!("warmpath_agent_proxy_busy_total").increment(1);
                let mut r = error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "agent_busy",
                    format!(
                        "the agent holds {} bytes of request bodies already; retry shortly",
                        s.bodies.used()
                    ),
                );
                r.headers_mut().insert(
                    header::RETRY_AFTER,
                    axum::http::HeaderValue::from_static("1"),
                );
                r
            }
        }
    }
}

/// The whole body, chunk by chunk, each counted in the `bodies` budget
/// before it is kept (so bodies held at once never pass it), within
/// `body_timeout` and `max_body_bytes`. The bytes stay counted while the
/// returned [`Held`] lives: until the engine answered.
async fn read_body(body: Body, s: &ProxyState) -> Result<(Bytes, Held), BodyFault> {
    let read = async {
        let mut held = s.bodies.hold(0).ok_or(BodyFault::Busy)?;
        let mut buf = BytesMut::new();
        let mut chunks = body.into_data_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| BodyFault::Unreadable(e.to_string()))?;
            if buf.len().saturating_add(chunk.len()) > s.max_body_bytes {
                return Err(BodyFault::Unreadable("length limit exceeded".into()));
            }
            if !held.grow(chunk.len()) {
                return Err(BodyFault::Busy);
            }
            buf.extend_from_slice(&chunk);
        }
        Ok((buf.freeze(), held))
    };
    tokio::time::timeout(s.body_timeout, read)
        .await
        .unwrap_or(Err(BodyFault::Late))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
        h.insert(
            "x-prefix-aware-id",
            header::HeaderValue::from_static("acme"),
        );
        let out = copy_headers(&h);
        assert_eq!(out.len(), 2);
        assert!(out.contains_key(header::AUTHORIZATION) && out.contains_key("x-prefix-aware-id"));
    }

    /// RFC 9110 section 7.6.1: a header that `Connection` names is for one
    /// hop only, so the proxy must not pass it to the engine (the agent once
    /// forwarded it; the router never did).
    #[tokio::test]
    async fn a_header_that_connection_names_does_not_reach_the_engine() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // The engine answers with the names of the headers it received.
        let engine = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let engine_addr = engine.local_addr().unwrap();
        let echo = Router::new().fallback(|h: HeaderMap| async move {
            h.keys().map(|k| k.as_str()).collect::<Vec<_>>().join(",")
        });
        tokio::spawn(async move { axum::serve(engine, echo).await.unwrap() });
        let (tx, _rx) = mpsc::channel(4);
        let state = ProxyState {
            client: reqwest::Client::new(),
            engine_url: format!("http://{engine_addr}"),
            observe_tx: tx,
            max_body_bytes: 1 << 20,
            queue: ByteBudget::new(1 << 20),
            bodies: ByteBudget::new(1 << 20),
            body_timeout: Duration::from_secs(5),
            stats: Arc::new(ObserveStats::default()),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, proxy_router(state)).await.unwrap() });
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(
            b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close, x-hop-secret\r\n\
              x-hop-secret: 1\r\nx-kept: 1\r\n\r\n",
        )
        .await
        .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), c.read_to_string(&mut answer))
            .await
            .expect("answered")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // The body (chunked or not) after the head.
        let seen = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        assert!(seen.contains("x-kept"), "{answer}");
        assert!(!seen.contains("x-hop-secret"), "{answer}");
    }

    /// A proxy on 127.0.0.1 in front of an engine that is not there, with
    /// `bodies` bytes of request bodies at once and `timeout` for a body;
    /// its budget and the observation queue's receiver.
    async fn proxy(
        bodies: usize,
        timeout: Duration,
    ) -> (std::net::SocketAddr, ByteBudget, mpsc::Receiver<Observed>) {
        let (tx, rx) = mpsc::channel(4);
        let budget = ByteBudget::new(bodies);
        let state = ProxyState {
            client: reqwest::Client::new(),
            engine_url: "http://127.0.0.1:9".into(),
            observe_tx: tx,
            max_body_bytes: 1 << 20,
            queue: ByteBudget::new(1 << 20),
            bodies: budget.clone(),
            body_timeout: timeout,
            stats: Arc::new(ObserveStats::default()),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, proxy_router(state)).await.unwrap();
        });
        (addr, budget, rx)
    }

    /// A new connection that sent a chat request's head declaring `length`
    /// body bytes, and `body`.
    async fn send(addr: std::net::SocketAddr, length: usize, body: &[u8]) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {length}\r\n\r\n"
        );
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(body).await.unwrap();
        c
    }

    /// The first bytes of the answer on `c` (within 10 s).
    async fn reply(c: &mut tokio::net::TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("answered")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_answered_408() {
        let (addr, _, _rx) = proxy(1 << 20, Duration::from_millis(200)).await;
        let mut c = send(addr, 100, b"{").await;
        let head = reply(&mut c).await;
        assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    }

    #[tokio::test]
    async fn bodies_past_the_budget_are_answered_503_until_the_held_ones_go() {
        let (addr, budget, _rx) = proxy(1000, Duration::from_millis(1500)).await;
        // A slow client holds 900 bytes of a 2000-byte body.
        let mut slow = send(addr, 2000, &[b'x'; 900]).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while budget.used() < 900 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(budget.used(), 900);
        // Another body of 500 bytes does not fit beside it: busy, retry.
        let mut other = send(addr, 500, &[b'y'; 500]).await;
        let head = reply(&mut other).await;
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        assert!(
            head.to_ascii_lowercase().contains("retry-after: 1"),
            "{head}"
        );
        assert!(head.contains("agent_busy"), "{head}");
        assert_eq!(budget.used(), 900, "the refused body gave its bytes back");
        // The slow one times out and gives its bytes back; the same body is
        // then read and forwarded (the engine is not there: 502).
        let head = reply(&mut slow).await;
        assert!(head.starts_with("HTTP/1.1 408"), "{head}");
        assert_eq!(budget.used(), 0);
        let mut again = send(addr, 500, &[b'y'; 500]).await;
        let head = reply(&mut again).await;
        assert!(head.starts_with("HTTP/1.1 502"), "{head}");
        assert_eq!(budget.used(), 0, "given back once the engine answered");
    }
}
