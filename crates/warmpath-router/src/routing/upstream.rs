//! What forwarding needs of the router, fixed at start: the pooled client,
//! credentials, deadlines and ejection rules.

use crate::config::RouterConfig;
use axum::http::HeaderValue;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// TCP connect timeout; past it the next backend is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Idle keep-alive connections kept per backend: a burst does not reconnect.
const MAX_IDLE_PER_BACKEND: usize = 256;

/// The upstream side of every forwarded request.
#[derive(Debug)]
pub(crate) struct Upstream {
    /// The pooled keep-alive client used for every backend.
    pub client: Client<HttpConnector, Full<Bytes>>,
    /// `upstream.api_key` as the `Authorization` sent upstream.
    pub auth: Option<HeaderValue>,
    /// Longest wait for an answer's headers.
    pub first_byte_timeout: Duration,
    /// Longest silence of a body once its headers are in.
    pub stream_idle_timeout: Duration,
    /// Longest a client may leave an answer unread (3 `server.header_timeout_ms`).
    pub send_timeout: Duration,
    /// Failures in a row that eject a backend.
    pub eject_after: u32,
    /// The most of a pool ejected at once, in percent.
    pub max_ejection_percent: u8,
    /// Cancelled when the shutdown deadline passes.
    pub halt: CancellationToken,
}

impl Upstream {
    /// The upstream side of a validated `config`, ended by `halt`.
    pub(crate) fn new(config: &RouterConfig, halt: CancellationToken) -> Self {
        let u = &config.upstream;
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.enforce_http(true);
        Upstream {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .pool_max_idle_per_host(MAX_IDLE_PER_BACKEND)
                .build(http),
            auth: u.api_key.as_ref().and_then(|k| k.bearer()),
            first_byte_timeout: Duration::from_millis(u.first_byte_timeout_ms),
            stream_idle_timeout: u.stream_idle_timeout(),
            send_timeout: config.server.send_timeout(),
            eject_after: config.health.eject_after,
            max_ejection_percent: config.health.max_ejection_percent,
            halt,
        }
    }
}
