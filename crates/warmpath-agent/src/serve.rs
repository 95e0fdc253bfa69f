//! The agent's HTTP server: hyper over an accept loop bounding what one client
//! can hold (connection cap, request-head deadline, keep-alive idle deadline;
//! docs/hostile-edges-agent.md).

use axum::Router;
use hyper::body::Incoming;
use hyper::service::{service_fn, Service};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use warmpath_edge::{raw_http1, ErrorBody, ErrorCode, LogEvery};

/// What one client may hold of the agent's HTTP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest time from a request head's first byte to its end.
    pub header_timeout: Duration,
    /// Longest time a keep-alive connection waits for its next request.
    pub idle_timeout: Duration,
    /// Connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: default_max_connections(),
        }
    }
}

/// 40% of the soft open-file limit, at least 1: the rest is left to router
/// links, event sockets, listeners and files. Raise `ulimit -n` to raise it.
pub fn default_max_connections() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20);
    ((soft.min(1 << 24) as usize) * 4 / 10).max(1)
}

/// How long in-flight requests get to finish once the agent stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` under `limits` until `cancel` fires; then
/// stops accepting and gives open connections `SHUTDOWN_GRACE` to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    cancel: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusal = refusal(limits.max_connections);
    let mut conns = JoinSet::new();
    // Accept failures (EMFILE, most likely) back off from 10 ms to 1 s.
    let (mut failures, mut delay_ms, log) = (0u64, 0u64, LogEvery::default());
    loop {
        // Finished connections are reaped as we go.
        while conns.try_join_next().is_some() {}
        let (tcp, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    if failures > 0 {
                        tracing::info!(failures, "accept works again");
                        (failures, delay_ms) = (0, 0);
                    }
                    a
                }
                Err(e) => {
                    failures += 1;
                    if log.ready().is_some() {
                        tracing::warn!(error = %e, failures,
                            "accept failed; backing off (logged at most every 10 s)");
                    }
                    delay_ms = (delay_ms * 2).clamp(10, 1_000);
                    tokio::select! {
                        () = cancel.cancelled() => {}
                        () = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
                    }
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            metrics::counter!("warmpath_agent_http_refused_total").increment(1);
            // Best effort, never waiting on the client.
            let _ = tcp.try_write(&refusal);
            continue;
        };
        conns.spawn(connection(
            tcp,
            peer,
            slot,
            app.clone(),
            limits,
            cancel.clone(),
        ));
    }
    drop(listener);
    let drained = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drained).await.is_err() {
        tracing::debug!(
            open = conns.len(),
            "connections still busy at shutdown; closed"
        );
        conns.shutdown().await;
    }
}

/// The bytes written to a connection over the cap.
fn refusal(max: usize) -> Vec<u8> {
    let status = axum::http::StatusCode::SERVICE_UNAVAILABLE;
    let message =
        format!("too many connections: the agent serves at most {max} at once; retry shortly");
    let body = ErrorBody {
        message: &message,
        kind: "agent_busy",
        param: None,
        code: ErrorCode::Status(status),
    };
    raw_http1(status, &[("retry-after", "1")], &body.json())
}

/// One connection's state, as its watchdog sees it. Times are milliseconds
/// since the connection opened, plus one (0: none).
#[derive(Debug)]
struct Activity {
    born: Instant,
    /// Requests between their head's end and their answer.
    in_flight: AtomicU64,
    /// When the pending request head began (0: none pending).
    head_since: AtomicU64,
    /// When the last request in flight ended.
    idle_since: AtomicU64,
    /// Wakes the watchdog when a head begins (its deadline moves earlier).
    head_began: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            born: Instant::now(),
            in_flight: AtomicU64::new(0),
            // The first request's head is due from the connection's start.
            head_since: AtomicU64::new(1),
            idle_since: AtomicU64::new(0),
            head_began: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        self.born.elapsed().as_millis() as u64 + 1
    }

    /// Bytes came in: with no request in flight they begin a head.
    fn on_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0
            && self.head_since.load(Ordering::Relaxed) == 0
        {
            self.head_since.store(self.now(), Ordering::Relaxed);
            self.head_began.notify_one();
        }
    }

    /// A whole head arrived; held until its answer ends.
    fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
        Busy(Arc::clone(self))
    }

    /// When this connection is to be closed, as things stand (None: a
    /// request is in flight).
    fn deadline(&self, limits: &HttpLimits) -> Option<(u64, &'static str)> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let ms = |d: Duration| d.as_millis() as u64;
        match self.head_since.load(Ordering::Relaxed) {
            0 => Some((
                self.idle_since.load(Ordering::Relaxed) + ms(limits.idle_timeout),
                "idle",
            )),
            t => Some((t + ms(limits.header_timeout), "header")),
        }
    }
}

/// A request in flight; dropped with its answer.
#[derive(Debug)]
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.idle_since.store(self.0.now(), Ordering::Relaxed);
        }
    }
}

/// The socket, telling [`Activity`] when bytes come in.
struct Watched {
    tcp: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.on_read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// Serves one connection until it ends, its watchdog closes it (a head too
/// slow, idle too long), or the agent stops (graceful: an answer in flight
/// is finished).
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    _slot: OwnedSemaphorePermit,
    app: Router,
    limits: HttpLimits,
    cancel: CancellationToken,
) {
    let activity = Arc::new(Activity::new());
    let (app, active) = (TowerToHyperService::new(app), Arc::clone(&activity));
    // Each request holds a `Busy` until its answer is ready.
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let busy = active.begin();
        let answer = app.call(req);
        async move {
            let resp = answer.await;
            drop(busy);
            resp
        }
    });
    let io = TokioIo::new(Watched {
        tcp,
        activity: Arc::clone(&activity),
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let mut conn = pin!(builder.serve_connection(io, service));
    let mut stopping = false;
    loop {
        let now = activity.now();
        let wake_at = match activity.deadline(&limits) {
            Some((at, why)) if at <= now => {
                metrics::counter!("warmpath_agent_http_timeouts_total", "reason" => why)
                    .increment(1);
                tracing::debug!(%peer, reason = why, "agent connection too slow or idle; closed");
                return;
            }
            Some((at, _)) => at,
            // In flight: looked at again when it may have ended.
            None => now + limits.header_timeout.min(limits.idle_timeout).as_millis() as u64,
        };
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::trace!(%peer, error = %e, "agent connection ended with an error");
                }
                return;
            }
            () = cancel.cancelled(), if !stopping => {
                // Idle: closed now; busy: after the answer in flight.
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = activity.head_began.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(wake_at - now)) => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limits() -> HttpLimits {
        HttpLimits {
            header_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(1000),
            max_connections: 4,
        }
    }

    #[test]
    fn a_head_is_due_from_the_start_then_idle_after_each_answer() {
        let a = Arc::new(Activity::new());
        let (at, why) = a.deadline(&limits()).unwrap();
        assert_eq!((at, why), (101, "header"));
        let busy = a.begin();
        assert_eq!(a.deadline(&limits()), None, "in flight: never timed");
        a.on_read(); // a body, or a pipelined head: not a new head
        assert_eq!(a.deadline(&limits()), None);
        drop(busy);
        let (at, why) = a.deadline(&limits()).unwrap();
        assert_eq!(why, "idle");
        assert!(at >= 1001, "{at}");
        a.on_read();
        let (_, why) = a.deadline(&limits()).unwrap();
        assert_eq!(why, "header", "the next head's first byte");
    }

    #[test]
    fn the_default_cap_follows_the_open_file_limit() {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1 << 20);
        let cap = default_max_connections() as u64;
        assert!(cap >= 1 && cap < soft.max(2), "{cap} of {soft}");
    }

    #[test]
    fn the_refusal_is_a_whole_http_answer() {
        let r = String::from_utf8(refusal(7)).unwrap();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "agent_busy");
    }
}
