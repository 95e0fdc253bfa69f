//! The HTTP front: accepts connections and serves them with hyper (HTTP/1.1
//! and HTTP/2). The proxied endpoints' exact paths are answered here (a
//! `POST` goes to its handler in [`crate::api`], any other method gets 405);
//! everything else goes through the axum [`Router`] of `server::app`.
//!
//! The proxied endpoints are the hot path: matching three fixed paths here
//! skips axum's routing (matched-path and URL-parameter extensions, a boxed
//! clone of the route's service per request), and keeps one table of them.

use crate::api;
use crate::error::ApiError;
use crate::state::Shared;
use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

/// The proxied endpoints, answered without axum's router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hot {
    Chat,
    Completions,
    Invocations,
}

impl Hot {
    /// The endpoint at exactly this path.
    fn of(req: &Request<Incoming>) -> Option<Self> {
        match req.uri().path() {
            api::CHAT_PATH => Some(Hot::Chat),
            api::COMPLETIONS_PATH => Some(Hot::Completions),
            api::INVOCATIONS_PATH => Some(Hot::Invocations),
            _ => None,
        }
    }
}

/// The per-connection service: the proxied paths here, the rest to axum.
#[derive(Clone)]
struct Front {
    shared: Arc<Shared>,
    router: Router,
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let Some(hot) = Hot::of(&req) else {
            let mut router = self.router.clone();
            return Box::pin(async move { router.call(req.map(Body::new)).await });
        };
        if req.method() != Method::POST {
            return Box::pin(async { Ok(method_not_allowed()) });
        }
        let shared = Arc::clone(&self.shared);
        let (parts, body) = req.into_parts();
        let body = Body::new(body);
        Box::pin(async move {
            Ok(match hot {
                Hot::Chat => api::chat(shared, parts.uri, parts.headers, body).await,
                Hot::Completions => api::completions(shared, parts.uri, parts.headers, body).await,
                Hot::Invocations => api::invocations(shared, parts.headers, body).await,
            })
        })
    }
}

/// 405 for a proxied path asked with another method than `POST`.
fn method_not_allowed() -> Response {
    let mut resp = ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: "this endpoint takes POST".into(),
        kind: "invalid_request_error",
        param: None,
        code: "method_not_allowed",
    }
    .into_response();
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    resp
}

/// Serves `listener` until `shutdown` is cancelled, then lets open
/// connections finish their in-flight requests. An HTTP/1.1 client has
/// `header_timeout` to send each request's header; one that half-closes
/// its socket after sending still gets its answer.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    router: Router,
    header_timeout: Duration,
    shutdown: CancellationToken,
) {
    let front = Front { shared, router };
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Answers stream in small writes (SSE chunks): without TCP_NODELAY,
        // Nagle's algorithm holds a chunk until the client's delayed ACK
        // (~40 ms) on a reused keep-alive connection — most visibly the
        // first token.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on a client connection");
        }
        let service = front.clone();
        let watcher = graceful.watcher();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            // hyper's header timeout starts at a request's first byte: a
            // connection that never sends one is cut off here.
            let mut first = [0u8; 1];
            let waited = tokio::select! {
                () = stop.cancelled() => return,
                w = tokio::time::timeout(header_timeout, tcp.peek(&mut first)) => w,
            };
            match waited {
                Ok(Ok(n)) if n > 0 => {}
                _ => {
                    tracing::debug!(%peer, "connection sent nothing in time; closed");
                    return;
                }
            }
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .half_close(true);
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::trace!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front").finish_non_exhaustive()
    }
}
