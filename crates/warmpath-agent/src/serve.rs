//! The agent's HTTP server: hyper over an accept loop bounding what one client
//! can hold (a connection cap, one request per connection, a deadline for it;
//! docs/hostile-edges-agent.md).

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use warmpath_edge::{open_file_share, raw_http1, AcceptBackoff, ErrorBody, ErrorCode};

/// What one client may hold of the agent's HTTP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest a connection may take to send its request and get the answer.
    pub request_timeout: Duration,
    /// Connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            request_timeout: Duration::from_secs(10),
            // The rest is left to router links, event sockets, listeners and files.
            max_connections: open_file_share(40),
        }
    }
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
    let mut backoff = AcceptBackoff::default();
    loop {
        // Finished connections are reaped as we go.
        while conns.try_join_next().is_some() {}
        let (tcp, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    backoff.succeeded();
                    a
                }
                Err(e) => {
                    tokio::select! {
                        () = cancel.cancelled() => {}
                        () = tokio::time::sleep(backoff.failed(&e)) => {}
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
        let conn = connection(tcp, peer, slot, app.clone(), limits, cancel.clone());
        conns.spawn(conn);
    }
    drop(listener);
    let drained = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drained).await.is_err() {
        let open = conns.len();
        tracing::debug!(open, "connections still busy at shutdown; closed");
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

/// Serves one request on `tcp`, which must arrive and be answered within the
/// header deadline (the agent's pages answer at once), then closes: with no
/// keep-alive there is no idle connection to bound. On shutdown an answer in
/// flight is finished.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    _slot: OwnedSemaphorePermit,
    app: Router,
    limits: HttpLimits,
    cancel: CancellationToken,
) {
    let service = TowerToHyperService::new(app);
    let mut builder = http1::Builder::new();
    builder.keep_alive(false);
    let mut conn = pin!(builder.serve_connection(TokioIo::new(tcp), service));
    let mut deadline = pin!(tokio::time::sleep(limits.request_timeout));
    let mut stopping = false;
    loop {
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::trace!(%peer, error = %e, "agent connection ended with an error");
                }
                return;
            }
            () = cancel.cancelled(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = deadline.as_mut() => {
                metrics::counter!("warmpath_agent_http_timeouts_total", "reason" => "header")
                    .increment(1);
                tracing::debug!(%peer, "agent connection too slow; closed");
                return;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
