//! Sending a routed request upstream and streaming the answer back frame by
//! frame ([`TrackedBody`]); retried elsewhere only when connecting failed.

use crate::control::metrics::Outcome;
use crate::http::error::ApiError;
use crate::http::layer::{layered, Layer};
use crate::http::requests::Routed;
use crate::routing::affinity::{IdTap, Tapped};
use crate::routing::backend::{Backend, FlightGuard};
use crate::routing::loads::AgentLoads;
use crate::routing::pool::Pool;
use crate::routing::route::{self, Plan};
use crate::routing::send_watch::{Held, SendWatch};
use crate::routing::share::{Fact, Replicas};
use crate::routing::upstream::Upstream;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request};
use axum::response::{IntoResponse, Response};
use axum::BoxError;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio_util::sync::WaitForCancellationFutureOwned;
use warmpath_edge::copy_end_to_end;

/// Header naming the backend that served a response.
pub(crate) const BACKEND_HEADER: &str = "x-warmpath-backend";
/// Header naming why that backend was chosen.
pub(crate) const DECISION_HEADER: &str = "x-warmpath-decision";

#[derive(Debug)]
pub(crate) struct Outgoing<'a> {
    /// `POST` for every endpoint but `GET /v1/responses/{id}`.
    pub method: Method,
    /// Path and query on the backend, e.g. `/v1/chat/completions`.
    pub path_and_query: &'a str,
    /// The client's headers (hop-by-hop ones are dropped).
    pub headers: &'a HeaderMap,
    pub body: Bytes,
}

/// Counts `e` as a request refused before a pool was known (`pool="-"`) and answers it.
pub(crate) fn rejected(e: ApiError) -> Response {
    crate::control::metrics::requests_counter("-", "-", "none", e.status).increment(1);
    e.into_response()
}

/// Counts a failure of `backend` toward ejection, within `health.max_ejection_percent`.
fn count_failure(up: &Upstream, pool: &Pool, backend: &Backend) {
    let _one_at_a_time = pool.ejecting.lock();
    if backend.failed_within(false, up.eject_after, || {
        pool.room_to_eject(up.max_ejection_percent)
    }) {
        tracing::warn!(pool = %pool.model, backend = %backend.endpoint.id(),
            "backend ejected after repeated failures");
    }
}

fn upstream_request(
    backend: &Backend,
    upstream_auth: Option<&HeaderValue>,
    out: &Outgoing<'_>,
) -> Result<Request<Full<Bytes>>, ApiError> {
    let uri = backend
        .endpoint
        .url
        .join(out.path_and_query)
        .map_err(|e| ApiError::internal(format!("cannot build the upstream URL: {e}")))?;
    let mut req = Request::builder()
        .method(out.method.clone())
        .uri(uri)
        .body(Full::new(out.body.clone()))
        .map_err(|e| ApiError::internal(format!("cannot build the upstream request: {e}")))?;
    let h = req.headers_mut();
    copy_end_to_end(out.headers, h, &[header::HOST, header::CONTENT_LENGTH]);
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(out.body.len()));
    backend.endpoint.authorize(h, upstream_auth);
    Ok(req)
}

/// How a client error names a backend: by id only where the pool shows routing.
fn shown(pool: &Pool, id: &str) -> String {
    match pool.expose_routing_headers {
        true => format!("backend {id}"),
        false => "the backend".to_owned(),
    }
}

/// Marks `resp` with its routing (and its headers, where the pool shows them).
fn tag(resp: &mut Response, pool: &Arc<Pool>, backend: Option<&str>, decision: &'static str) {
    resp.extensions_mut().insert(Routed {
        pool: Arc::clone(pool),
        backend: backend.map(str::to_owned),
        decision,
    });
    let Some(backend) = backend.filter(|_| pool.expose_routing_headers) else {
        return;
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(backend) {
        h.insert(BACKEND_HEADER, v);
    }
    h.insert(DECISION_HEADER, HeaderValue::from_static(decision));
}

/// Routes `plan` and proxies `out` through `up`, retrying other backends on
/// connect failure; the other `replicas` hear of each pick.
pub(crate) async fn forward(
    up: &Arc<Upstream>,
    loads: Option<&dyn AgentLoads>,
    replicas: Option<Replicas<'_>>,
    plan: &Plan,
    out: Outgoing<'_>,
) -> Response {
    let pool = &plan.target.pool;
    let strategy = plan.policy.strategy.as_str();
    let mut excluded: Vec<usize> = Vec::new();
    loop {
        let decision = match route::pick(plan, &excluded, loads, replicas.map(|r| r.source)) {
            Ok(d) => d,
            Err(mut e) => {
                if !excluded.is_empty() {
                    let tried: Vec<&str> = excluded
                        .iter()
                        .map(|&i| plan.policy.backends[i].endpoint.id())
                        .collect();
                    let tried = match pool.expose_routing_headers {
                        true => format!(" (tried {})", tried.join(", ")),
                        false => String::new(),
                    };
                    e = ApiError::upstream(format!(
                        "could not connect to any backend of `{}`{tried}",
                        pool.model,
                    ));
                }
                return failed(e, pool, strategy, None, "none");
            }
        };
        let backend = Arc::clone(&plan.policy.backends[decision.backend]);
        let kind = decision.kind.as_str();
        // The blocks it must prefill (its prefill prediction).
        let uncached =
            (plan.hashes.len() as u64).saturating_sub(u64::from(decision.matched_blocks));
        let mut guard = backend.begin(uncached);
        if let Some(r) = replicas {
            let fact = fact(plan, backend.endpoint.id(), uncached);
            guard.share(r.sink.start(&pool.model, fact));
        }
        let req = match upstream_request(&backend, up.auth.as_ref(), &out) {
            Ok(r) => r,
            Err(e) => {
                guard.outcome(Outcome::Failed);
                return e.into_response();
            }
        };
        let sent = Instant::now();
        let limit = up.first_byte_timeout;
        let queued_behind = backend.load.in_flight() > 1;
        let Ok(answer) = tokio::time::timeout(limit, up.client.request(req)).await else {
            // Dropping the request closes its connection: the engine stops.
            tracing::warn!(pool = %pool.model, backend = %backend.endpoint.id(), ?limit,
                "no answer from the backend in time; not retried");
            // Waiting behind this router's other requests proves a queue, not a fault.
            if !queued_behind && backend.load.in_flight() <= 1 {
                count_failure(up, pool, &backend);
            }
            guard.outcome(Outcome::Timeout);
            let err = ApiError::upstream_timeout(format!(
                "{} sent no answer within {} ms",
                shown(pool, backend.endpoint.id()),
                limit.as_millis()
            ));
            return failed(err, pool, strategy, Some(backend.endpoint.id()), kind);
        };
        match answer {
            Ok(resp) => {
                let status = resp.status();
                // The engine itself failed (501 and 505+ are the request's):
                // passed through, not retried (it may have had effects).
                if matches!(status.as_u16(), 500 | 502 | 503 | 504) {
                    count_failure(up, pool, &backend);
                }
                // Otherwise a success once the whole body is through.
                pool.metrics.count(strategy, kind, status);
                let matched = u64::from(decision.matched_blocks);
                pool.metrics.matched_blocks.record(matched as f64);
                pool.metrics
                    .predicted_tokens
                    .increment(matched * pool.block_size as u64);
                if !plan.hashes.is_empty() {
                    pool.hot
                        .record(&plan.hashes, backend.endpoint.id(), plan.preview.as_deref());
                }
                tracing::debug!(pool = %pool.model, backend = %backend.endpoint.id(),
                    decision = kind, matched, %status, "proxied");
                let tap = (plan.learns_response && status.is_success())
                    .then(|| IdTap::new(backend.endpoint.id().to_owned()));
                return respond(up, resp, guard, sent, pool, kind, tap);
            }
            Err(e) if e.is_connect() => {
                guard.outcome(Outcome::ConnectError);
                drop(guard);
                tracing::warn!(pool = %pool.model, backend = %backend.endpoint.id(), error = %e,
                    "connect failed; trying another backend");
                count_failure(up, pool, &backend);
                excluded.push(decision.backend);
            }
            Err(e) => {
                tracing::warn!(pool = %pool.model, backend = %backend.endpoint.id(), error = %e,
                    "upstream request failed after it was sent; not retried");
                count_failure(up, pool, &backend);
                guard.outcome(Outcome::Failed);
                // hyper's words stay in the log: they name sockets and internals no client needs.
                let err = ApiError::upstream(format!(
                    "{} failed before answering",
                    shown(pool, backend.endpoint.id())
                ));
                return failed(err, pool, strategy, Some(backend.endpoint.id()), kind);
            }
        }
    }
}

/// `err`, counted and tagged as the answer of `decision`.
fn failed(
    err: ApiError,
    pool: &Arc<Pool>,
    strategy: &'static str,
    backend: Option<&str>,
    decision: &'static str,
) -> Response {
    pool.metrics.count(strategy, decision, err.status);
    let mut resp = err.into_response();
    tag(&mut resp, pool, backend, decision);
    resp
}

fn respond(
    up: &Arc<Upstream>,
    resp: hyper::Response<Incoming>,
    guard: FlightGuard,
    sent: Instant,
    pool: &Arc<Pool>,
    decision: &'static str,
    tap: Option<IdTap>,
) -> Response {
    let (parts, incoming) = resp.into_parts();
    let backend_id = guard.backend.endpoint.id().to_owned();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let now = Instant::now();
    let held = Arc::new(parking_lot::Mutex::new(Held {
        inner: Some(incoming),
        guard: Some(guard),
    }));
    let send = SendWatch::start(&held, up.send_timeout, backend_id.clone());
    let body = TrackedBody {
        held,
        send,
        sent,
        first: true,
        sse,
        ok: !parts.status.is_server_error(),
        done: false,
        pool: Arc::clone(pool),
        up: Arc::clone(up),
        last_frame: now,
        idle: tokio::time::sleep_until((now + up.stream_idle_timeout).into()),
        halt: up.halt.clone().cancelled_owned(),
        tail: *b"\n\n",
    };
    let tap = Remember(tap.map(|tap| (tap, Arc::clone(pool))));
    let mut out = Response::new(Body::new(layered(body, tap)));
    *out.status_mut() = parts.status;
    copy_end_to_end(&parts.headers, out.headers_mut(), &[]);
    tag(&mut out, pool, Some(&backend_id), decision);
    out
}

/// A body streamed to its end: a success for the backend below 500.
fn ended(held: &mut Held, ok: bool) {
    let Some(mut guard) = held.guard.take() else {
        return;
    };
    if ok {
        guard.backend.health.succeeded();
        guard.outcome(Outcome::Ok);
    } else {
        guard.outcome(Outcome::ServerError);
    }
}

/// Remembers which backend gave a `/v1/responses` answer its id.
struct Remember(Option<(IdTap, Arc<Pool>)>);

impl Layer for Remember {
    fn frame(&mut self, frame: &Frame<Bytes>) {
        let (Some((tap, pool)), Some(data)) = (self.0.as_mut(), frame.data_ref()) else {
            return;
        };
        match tap.feed(data) {
            Tapped::More => return,
            Tapped::Found(id) => pool.responses.remember(&id, &tap.worker),
            Tapped::GiveUp => {}
        }
        self.0 = None;
    }
}

pin_project_lite::pin_project! {
    /// The upstream body, passed through frame by frame with load accounting;
    /// it ends early when the backend goes silent or the shutdown deadline passes.
    pub struct TrackedBody {
        // Shared with the send watchdog; the guard is taken when the body
        // ends, however it ends, so a request past its timeout is no load.
        held: Arc<parking_lot::Mutex<Held>>,
        send: SendWatch,
        sent: Instant,
        first: bool,
        sse: bool,
        // Below 500: a success for the backend once the body is through.
        ok: bool,
        done: bool,
        pool: Arc<Pool>,
        up: Arc<Upstream>,
        last_frame: Instant,
        // Reset lazily (when it fires early), not on every frame.
        #[pin]
        idle: tokio::time::Sleep,
        #[pin]
        halt: WaitForCancellationFutureOwned,
        // The last two bytes passed on: an error event must not merge into
        // an event the backend left half-sent.
        tail: [u8; 2],
    }
}

/// How a tracked body ended early: the backend failed mid-answer, sent
/// nothing for the idle limit, or the shutdown deadline passed.
enum Cut {
    Failed(hyper::Error),
    Stalled,
    Halted,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        this.send.asked();
        let held = Arc::clone(this.held);
        let mut held = held.lock();
        let held = &mut *held;
        let Some(inner) = held.inner.as_mut() else {
            // The send watchdog let the backend go: the client read nothing.
            *this.done = true;
            return Poll::Ready(Some(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing of the answer in time",
            )
            .into())));
        };
        let cut = match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.last_frame = Instant::now();
                if *this.first && frame.is_data() {
                    *this.first = false;
                    if let Some(g) = held.guard.as_mut() {
                        g.first_byte();
                    }
                    this.pool
                        .metrics
                        .first_byte
                        .record(this.sent.elapsed().as_secs_f64());
                }
                if let Some(data) = frame.data_ref().filter(|_| *this.sse) {
                    match data.len() {
                        0 => {}
                        1 => *this.tail = [this.tail[1], data[0]],
                        n => *this.tail = [data[n - 2], data[n - 1]],
                    }
                }
                if inner.is_end_stream() {
                    // hyper may not poll a body whose length is reached.
                    *this.done = true;
                    ended(held, *this.ok);
                } else {
                    this.send.handed();
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => Cut::Failed(e),
            Poll::Ready(None) => {
                *this.done = true;
                ended(held, *this.ok);
                return Poll::Ready(None);
            }
            Poll::Pending => {
                if this.halt.as_mut().poll(cx).is_ready() {
                    Cut::Halted
                } else {
                    loop {
                        if this.idle.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        let due = *this.last_frame + this.up.stream_idle_timeout;
                        if due <= Instant::now() {
                            break Cut::Stalled;
                        }
                        this.idle.as_mut().reset(due.into());
                    }
                }
            }
        };
        *this.done = true;
        let Some(mut guard) = held.guard.take() else {
            return Poll::Ready(None);
        };
        let backend = guard.backend.endpoint.id();
        let named = shown(this.pool, backend);
        let (outcome, err) = match &cut {
            Cut::Failed(e) => {
                tracing::warn!(pool = %this.pool.model, %backend, error = %e,
                    "backend failed mid-response");
                let message = format!("{named} failed while streaming the response");
                (Outcome::Failed, ApiError::upstream(message))
            }
            Cut::Stalled => {
                let ms = this.up.stream_idle_timeout.as_millis();
                tracing::warn!(pool = %this.pool.model, %backend, idle_ms = ms as u64,
                    "backend went silent mid-response; cut off");
                count_failure(this.up, this.pool, &guard.backend);
                let message = format!("{named} sent nothing for {ms} ms");
                (Outcome::Timeout, ApiError::upstream_timeout(message))
            }
            Cut::Halted => (Outcome::Cancelled, ApiError::shutting_down()),
        };
        guard.outcome(outcome);
        drop(guard);
        if *this.sse {
            // Close an event the backend left half-sent first.
            let open = match this.tail {
                [b'\n', b'\n'] => "",
                [_, b'\n'] => "\n",
                _ => "\n\n",
            };
            let event = format!("{open}data: {}\n\n", err.body());
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))));
        }
        Poll::Ready(Some(Err(match cut {
            Cut::Failed(e) => e.into(),
            _ => std::io::Error::new(std::io::ErrorKind::TimedOut, err.message).into(),
        })))
    }

    fn is_end_stream(&self) -> bool {
        // An answer the watchdog took ends with an error, not cleanly.
        self.done
            || self
                .held
                .lock()
                .inner
                .as_ref()
                .is_some_and(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        if self.sse {
            // An error event may be appended: promise nothing.
            SizeHint::default()
        } else {
            self.held
                .lock()
                .inner
                .as_ref()
                .map_or_else(SizeHint::default, Incoming::size_hint)
        }
    }
}

/// What the other replicas are told of a pick of `plan` on `worker`: the prefix's home after it.
fn fact(plan: &route::Plan, worker: &str, prefill_blocks: u64) -> Fact {
    let key = plan.prefix_key.0;
    let id = |i: usize| {
        plan.policy
            .backends
            .get(i)
            .map(|b| b.endpoint.id().to_owned())
    };
    let home = plan.policy.learns.as_ref().and_then(|l| l.home_of(key));
    Fact {
        worker: worker.to_owned(),
        prefix_key: key,
        chain_blocks: plan.hashes.len() as u32,
        prefill_blocks,
        home: home
            .as_ref()
            .and_then(|h| id(h.backend))
            .unwrap_or_default(),
        copies: home
            .map(|h| h.copies.into_iter().filter_map(id).collect())
            .unwrap_or_default(),
    }
}
