//! The HTTP front: serves connections with hyper (HTTP/1.1 and HTTP/2), the
//! proxied paths matched here (skipping axum's routing on the hot path).

use crate::api::openai::{self as api, Proxied};
use crate::control::state::Shared;
use crate::http::clock::monotonic_ms;
use crate::http::conn::{Activity, Conns, Slot};
use crate::http::error::ApiError;
use crate::http::layer::layered;
use crate::http::requests::{self, Record, Routed};
use crate::http::socket::Watched;
use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower_service::Service;
use tracing::Instrument;
use warmpath_edge::AcceptBackoff;

/// The per-connection service: the proxied paths here, the rest to axum.
#[derive(Clone, Debug)]
struct Front {
    shared: Arc<Shared>,
    router: Router,
    activity: Arc<Activity>,
}

impl hyper::service::Service<Request<Incoming>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        let busy = self.activity.begin();
        let started = Instant::now();
        let shared = Arc::clone(&self.shared);
        // Forwarded upstream with the client's other headers.
        let id = requests::request_id(req.headers());
        req.headers_mut().insert(requests::REQUEST_ID, id.clone());
        let span = requests::span(&id);
        // Only the access log reads the path: no copy without it (`enabled!` is cached).
        let access_log = tracing::enabled!(target: requests::ACCESS_TARGET, tracing::Level::INFO);
        let path = match access_log {
            true => req.uri().path().to_owned(),
            false => String::new(),
        };
        let method = req.method().clone();
        let refused = crate::control::access::edge(
            shared.hosts.as_deref(),
            &method,
            req.uri(),
            req.headers(),
        )
        .err();
        let hot = Proxied::of_path(req.uri().path());
        let router = hot.is_none().then(|| self.router.clone());
        // `Connection` is HTTP/1's (HTTP/2 forbids it).
        let h1 = req.version() < Version::HTTP_2;
        Box::pin(async move {
            let answer = async {
                if let Some(e) = refused {
                    return crate::routing::proxy::rejected(e);
                }
                let hot = match (hot, router) {
                    (Some(hot), _) => hot,
                    (None, Some(mut router)) => {
                        return match router.call(req.map(Body::new)).await {
                            Ok(r) => r,
                            Err(never) => match never {},
                        }
                    }
                    (None, None) => return ApiError::internal("no route table").into_response(),
                };
                if req.method() != Method::POST {
                    return crate::http::error::method_not_allowed("POST");
                }
                let (parts, body) = req.into_parts();
                let (s, body) = (Arc::clone(&shared), Body::new(body));
                api::serve(s, hot, parts.uri, parts.headers, body).await
            };
            // Past the shutdown deadline a request still waiting is answered now.
            let resp = tokio::select! {
                biased;
                r = answer.instrument(span.clone()) => r,
                () = shared.halt.cancelled() => ApiError::shutting_down().into_response(),
            };
            let (mut parts, body) = resp.into_parts();
            parts.headers.insert(requests::REQUEST_ID, id);
            let record = Record {
                started,
                head: started.elapsed(),
                method,
                path,
                status: parts.status,
                routed: parts.extensions.remove::<Routed>(),
                proxied: hot.is_some(),
                access_log,
                span,
            };
            if h1 && shared.draining() {
                // Clients move to another replica instead of reusing this one.
                parts
                    .headers
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            let body = Body::new(layered(body, (record, busy)));
            Ok(Response::from_parts(parts, body))
        })
    }
}

/// After `Shared::halt`, the time an answer has to write its last bytes.
const FLUSH_MS: u64 = 500;

/// Serves `listener` until `shutdown` is cancelled, then drains: serves
/// `server.drain_grace_ms` more while not ready, stops accepting, and waits
/// at most `server.shutdown_timeout()` for requests in flight.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    router: Router,
    conns: Arc<Conns>,
    shutdown: CancellationToken,
) {
    let grace = Duration::from_millis(shared.config.server.drain_grace_ms);
    let timeout = shared.config.server.shutdown_timeout();
    let refusal = refusal(conns.limits.max_connections);
    let closing = CancellationToken::new();
    let mut backoff = AcceptBackoff::default();
    let mut grace_over = pin!(async {
        shutdown.cancelled().await;
        shared.start_draining();
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "shutting down: not ready, still serving"
        );
        tokio::time::sleep(grace).await;
    });
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut grace_over => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    backoff.succeeded();
                    a
                }
                Err(e) => {
                    // Out of file descriptors, most likely: idle ones close first.
                    conns.pressure.notify_waiters();
                    tokio::time::sleep(backoff.failed(&e)).await;
                    continue;
                }
            },
        };
        let Some(slot) = conns.admit() else {
            // Refused at once: best effort, never waiting on the client.
            let _ = tcp.try_write(&refusal);
            continue;
        };
        // Answers stream in small writes: no Nagle delay (~40 ms a chunk).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on a client connection");
        }
        let front = Front {
            shared: Arc::clone(&shared),
            router: router.clone(),
            activity: Arc::clone(&slot.activity),
        };
        tokio::spawn(connection(tcp, peer, slot, front, closing.clone()));
    }
    drop(listener);
    closing.cancel();
    tracing::info!(
        open = conns.open(),
        "no longer accepting; waiting for in-flight requests"
    );
    if tokio::time::timeout(timeout, conns.all_closed())
        .await
        .is_err()
    {
        tracing::warn!(
            open = conns.open(),
            timeout_ms = timeout.as_millis() as u64,
            "shutdown deadline passed; ending what remains"
        );
        shared.halt.cancel();
        let flush = Duration::from_millis(FLUSH_MS * 2);
        let _ = tokio::time::timeout(flush, conns.all_closed()).await;
    }
}

/// Serves one connection, closing it when its watchdog says so.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    front: Front,
    closing: CancellationToken,
) {
    let conns = Arc::clone(&slot.conns);
    let limits = conns.limits;
    let activity = Arc::clone(&slot.activity);
    let halt = front.shared.halt.clone();
    let recheck = limits.header_timeout.min(limits.keepalive_idle);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client's end of stream means it left: its upstream request is dropped.
    // hyper's header timer is off: the watchdog enforces the timeouts.
    builder
        .http1()
        .timer(TokioTimer::new())
        .half_close(false)
        .header_read_timeout(None);
    let io = TokioIo::new(Watched::new(tcp, Arc::clone(&activity)));
    let mut conn = pin!(builder.serve_connection(io, front));
    let mut stopping = false;
    let mut flush_until = None;
    loop {
        let now = monotonic_ms();
        let wake_at = match flush_until {
            Some(t) => t,
            None => match activity.close_at(&limits, conns.under_pressure()) {
                Some(t) if t <= now => {
                    tracing::debug!(%peer, "connection idle or too slow; closed");
                    return;
                }
                Some(t) => t,
                None => now + recheck.as_millis() as u64,
            },
        };
        let pressed = conns.pressure.notified();
        let changed = activity.changed.notified();
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::trace!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            () = closing.cancelled(), if !stopping => {
                // Idle: closed now; busy: after the answer in flight.
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = halt.cancelled(), if flush_until.is_none() => {
                flush_until = Some(now + FLUSH_MS);
            }
            () = pressed => {}
            () = changed => {}
            () = tokio::time::sleep(Duration::from_millis(wake_at.saturating_sub(now))) => {
                if flush_until.is_some() {
                    return;
                }
            }
        }
    }
}

/// The answer written to a connection over `max_connections`.
fn refusal(max: usize) -> Vec<u8> {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_connections",
        format!("too many connections: the router serves at most {max} at once"),
    )
    .raw_http1()
}
