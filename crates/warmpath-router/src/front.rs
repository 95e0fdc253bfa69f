//! The HTTP front: accepts connections and serves them with hyper (HTTP/1.1
//! and HTTP/2), sending the proxied `POST`s straight to their handlers and
//! everything else through the axum [`Router`] of [`crate::server::app`].
//!
//! The proxied endpoints are the hot path; axum's routing (path matching,
//! matched-path and URL-parameter extensions, a boxed clone of the route's
//! service per request) is cheap on a warm core but touches code and data a
//! core serving a few hundred requests a second no longer holds. A `POST` to
//! one of their exact paths skips it; the handlers are the same functions
//! the router would call, so behaviour is identical (the e2e tests run
//! through this front).

use crate::api;
use crate::state::Shared;
use axum::body::Body;
use axum::http::{Method, Request};
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
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

/// The proxied endpoints, served without axum's router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hot {
    Chat,
    Completions,
    Invocations,
}

impl Hot {
    /// The endpoint a `POST` to exactly its path asks for.
    fn of(req: &Request<Incoming>) -> Option<Self> {
        if req.method() != Method::POST {
            return None;
        }
        match req.uri().path() {
            api::CHAT_PATH => Some(Hot::Chat),
            api::COMPLETIONS_PATH => Some(Hot::Completions),
            api::INVOCATIONS_PATH => Some(Hot::Invocations),
            _ => None,
        }
    }
}

/// The per-connection service: hot `POST`s to their handler, the rest to axum.
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
        let shared = Arc::clone(&self.shared);
        let (parts, body) = req.into_parts();
        let body = Body::new(body);
        Box::pin(async move {
            Ok(match hot {
                Hot::Chat => api::chat_parts(shared, parts.uri, parts.headers, body).await,
                Hot::Completions => {
                    api::completions_parts(shared, parts.uri, parts.headers, body).await
                }
                Hot::Invocations => api::invocations_parts(shared, parts.headers, body).await,
            })
        })
    }
}

/// Serves `listener` until `shutdown` is cancelled, then lets open
/// connections finish their in-flight requests.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    router: Router,
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
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
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
