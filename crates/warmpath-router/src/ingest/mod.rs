//! The gRPC ingest: agents publish their workers' block sets here
//! (`proto/warmpath/v1/cache_events.proto`), and this module applies them to
//! each pool's [`CacheIndex`].
//!
//! - Each stream starts with `Hello` (checked: shared token, known model,
//!   block size equal to the pool's, epoch not older than the known one), then
//!   a chunked snapshot that replaces the worker's entries atomically, then
//!   ordered deltas. A gap answers `ResendSnapshot` and ignores deltas until
//!   the next snapshot ([`stream`]).
//! - A newer epoch, or a reconnect, takes the worker over; the older stream is
//!   closed on its next message.
//! - The [`sweeper`] marks workers silent past `stale_after` stale (their
//!   entries stop counting for `kv_aware`) and clears them after
//!   `drop_after`.
//! - Several router replicas each receive every agent's stream; since each
//!   applies the same snapshot + deltas, they converge to the same index.

mod agents;
mod stream;
mod sweeper;
#[cfg(test)]
mod tests;

pub use agents::{AgentStatus, Agents};
pub use sweeper::spawn_sweeper;

use crate::pool::Pools;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use stream::{Refusal, WorkerStream};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;
use warmpath_core::CacheIndex;
use warmpath_proto::v1::{self, agent_message::Msg, router_message, AgentMessage, RouterMessage};
use warmpath_proto::{CacheEvents, CacheEventsServer};

/// The index and block size of one pool, as the ingest needs them.
#[derive(Clone, Debug)]
pub struct IngestPool {
    /// The pool's model.
    pub model: String,
    /// The pool's index.
    pub index: Arc<CacheIndex>,
    /// Tokens per block of the pool.
    pub block_size: usize,
}

/// Where the ingest finds pools by model.
pub trait PoolDirectory: Send + Sync + 'static {
    /// The pool serving base model `model`.
    fn pool(&self, model: &str) -> Option<IngestPool>;
    /// Every pool.
    fn pools(&self) -> Vec<IngestPool>;
}

impl PoolDirectory for Pools {
    fn pool(&self, model: &str) -> Option<IngestPool> {
        self.index_of(model).map(|(index, block_size)| IngestPool {
            model: model.to_owned(),
            index,
            block_size,
        })
    }
    fn pools(&self) -> Vec<IngestPool> {
        self.all()
            .iter()
            .map(|p| IngestPool {
                model: p.model.clone(),
                index: Arc::clone(&p.index),
                block_size: p.block_size,
            })
            .collect()
    }
}

/// Ingest settings.
#[derive(Clone, Debug)]
pub struct IngestConfig {
    /// Shared token agents must present (`authorization: Bearer <token>`).
    pub token: Option<String>,
    /// Silence after which a worker's entries stop counting.
    pub stale_after: Duration,
    /// Silence after which a worker's entries are cleared.
    pub drop_after: Duration,
    /// PEM certificate and key: serve TLS.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            token: None,
            stale_after: Duration::from_secs(10),
            drop_after: Duration::from_secs(120),
            tls: None,
        }
    }
}

/// Errors of the ingest server.
#[derive(Debug, Error)]
pub enum IngestError {
    /// The gRPC server failed (bind, TLS setup, transport). Retrying may work
    /// for transient socket errors; a bad certificate will fail again.
    #[error("gRPC ingest server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The `CacheEvents` service.
#[derive(Clone)]
pub struct IngestService {
    dir: Arc<dyn PoolDirectory>,
    agents: Arc<Agents>,
    token: Option<String>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for IngestService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngestService")
            .field("auth", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

impl IngestService {
    /// A service over `dir`, recording agents in `agents`.
    pub fn new(
        dir: Arc<dyn PoolDirectory>,
        agents: Arc<Agents>,
        token: Option<String>,
        shutdown: CancellationToken,
    ) -> Self {
        IngestService {
            dir,
            agents,
            token,
            shutdown,
        }
    }
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn refused(r: &Refusal) -> RouterMessage {
    RouterMessage {
        msg: Some(router_message::Msg::Refused(v1::Refused {
            reason: r.reason.clone(),
            retryable: r.retryable,
        })),
    }
}

type Out = Pin<Box<dyn Stream<Item = Result<RouterMessage, Status>> + Send>>;

#[tonic::async_trait]
impl CacheEvents for IngestService {
    type PublishStream = Out;

    async fn publish(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::PublishStream>, Status> {
        if let Some(token) = &self.token {
            if !warmpath_proto::check_bearer(request.metadata(), token) {
                metrics::counter!("warmpath_ingest_refused_total", "reason" => "auth").increment(1);
                tracing::warn!(remote = ?request.remote_addr(), "agent stream refused: missing or wrong token");
                return Err(Status::unauthenticated("missing or wrong agent token"));
            }
        }
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<RouterMessage, Status>>(64);
        let dir = Arc::clone(&self.dir);
        let agents = Arc::clone(&self.agents);
        let shutdown = self.shutdown.clone();
        // Owned by the stream: ends when the agent closes, the response
        // stream is dropped (send fails) or the router shuts down.
        tokio::spawn(async move {
            let first = tokio::select! {
                m = inbound.next() => m,
                () = shutdown.cancelled() => return,
            };
            let hello = match first {
                Some(Ok(AgentMessage {
                    msg: Some(Msg::Hello(h)),
                })) => h,
                Some(Ok(_)) => {
                    let r = Refusal {
                        reason: "the first message must be Hello".into(),
                        retryable: true,
                    };
                    let _ = tx.send(Ok(refused(&r))).await;
                    return;
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "agent stream failed before Hello");
                    return;
                }
                None => return,
            };
            let span = tracing::info_span!("agent", worker = %hello.worker_id, model = %hello.model, epoch = hello.epoch);
            drive(dir, agents, hello, inbound, tx, shutdown)
                .instrument(span)
                .await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx)) as Out))
    }
}

/// Runs one stream after its Hello until it ends.
async fn drive(
    dir: Arc<dyn PoolDirectory>,
    agents: Arc<Agents>,
    hello: v1::Hello,
    mut inbound: Streaming<AgentMessage>,
    tx: mpsc::Sender<Result<RouterMessage, Status>>,
    shutdown: CancellationToken,
) {
    let Some(pool) = dir.pool(&hello.model) else {
        let r = Refusal {
            reason: format!("no pool serves model {:?}", hello.model),
            retryable: false,
        };
        tracing::error!(reason = %r.reason, "agent refused");
        metrics::counter!("warmpath_ingest_refused_total", "reason" => "model").increment(1);
        let _ = tx.send(Ok(refused(&r))).await;
        return;
    };
    let mut ws = match WorkerStream::open(pool, agents, &hello, crate::monotonic_ms()) {
        Ok(ws) => ws,
        Err(r) => {
            tracing::error!(reason = %r.reason, "agent refused");
            let _ = tx.send(Ok(refused(&r))).await;
            return;
        }
    };
    tracing::info!(block_size = hello.block_size, "agent connected");
    'stream: loop {
        let next = tokio::select! {
            m = inbound.next() => m,
            () = shutdown.cancelled() => break,
            () = tx.closed() => break,
        };
        let msg = match next {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                tracing::info!(error = %e, "agent stream broke");
                break;
            }
            None => break,
        };
        match ws.on_message(msg, crate::monotonic_ms(), unix_micros()) {
            Ok(answers) => {
                for a in answers {
                    if tx.send(Ok(a)).await.is_err() {
                        break 'stream;
                    }
                }
            }
            Err(r) => {
                tracing::warn!(reason = %r.reason, "agent stream closed");
                let _ = tx.send(Ok(refused(&r))).await;
                break;
            }
        }
    }
    ws.close();
    tracing::info!("agent disconnected");
}

/// Serves the ingest on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    service: IngestService,
    tls: Option<(Vec<u8>, Vec<u8>)>,
    shutdown: CancellationToken,
) -> Result<(), IngestError> {
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .tcp_nodelay(true);
    if let Some((cert, key)) = tls {
        let identity = tonic::transport::Identity::from_pem(cert, key);
        builder =
            builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))?;
    }
    let incoming = TcpListenerStream::new(listener);
    builder
        .add_service(CacheEventsServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await?;
    Ok(())
}
