//! The gRPC ingest: agents publish their workers' block sets here
//! (`proto/warmpath/v1/cache_events.proto`), and this module applies them to
//! each pool's [`CacheIndex`].
//!
//! - Each stream starts with `Hello` (checked: shared token, known model,
//!   block size equal to the pool's, epoch not older than the known one), then
//!   a chunked snapshot that replaces the worker's entries atomically, then
//!   ordered deltas. A gap answers `ResendSnapshot` and ignores deltas until
//!   the next snapshot (module `stream`).
//! - A newer epoch, or a reconnect, takes the worker over; the older stream is
//!   closed on its next message.
//! - The `sweeper` module marks workers silent past `stale_after` stale (their
//!   entries stop counting for `kv_aware`) and clears them after
//!   `drop_after`; it also compacts each pool's dead holders every
//!   `index.compact_interval_ms`, and calls the hook of
//!   [`set_memory_release`] once the indexes freed 8 MiB.
//! - Each worker is capped at its engine's reported capacity
//!   (`Load.capacity_blocks`) times `index.capacity_slack`, at most
//!   `index.max_worker_blocks` (also the cap while no capacity is known), and
//!   the pool at `index.max_entries`: blocks beyond are refused, counted in
//!   `warmpath_ingest_refused_blocks_total{pool,reason}` and logged (at most
//!   one WARN per stream every 10 s).
//! - Several router replicas each receive every agent's stream; since each
//!   applies the same snapshot + deltas, they converge to the same index.

mod agents;
mod stream;
mod sweeper;
#[cfg(test)]
mod tests;

pub use agents::{AgentStatus, Agents};
pub use sweeper::{set_memory_release, spawn_sweeper};
// The settings are configuration (`config::ingest`); re-exported for embedders.
pub use crate::config::{IngestConfig, TlsPem};

use crate::pool::Pools;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use stream::{Refusal, WorkerStream};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;
use warmpath_core::CacheIndex;
use warmpath_proto::error_chain;
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
    /// The worker ids of the pool's backends: a Hello for any other id is
    /// refused (its entries could never be routed to). `None` accepts any.
    pub known_workers: Option<Arc<[String]>>,
    /// Bounds of `index`: the per-worker caps the streams set, the
    /// compaction period the sweeper keeps.
    pub bounds: crate::config::IndexSettings,
}

impl IngestPool {
    fn of(p: &crate::pool::Pool) -> Self {
        IngestPool {
            model: p.model.clone(),
            index: Arc::clone(&p.index),
            block_size: p.block_size,
            known_workers: Some(p.backends().iter().map(|b| b.id.clone()).collect()),
            bounds: p.index_bounds,
        }
    }
}

/// Where the ingest finds pools by model.
pub trait PoolDirectory: Send + Sync + 'static {
    /// The pool serving base model `model`.
    fn pool(&self, model: &str) -> Option<IngestPool>;
    /// Every pool.
    fn pools(&self) -> Vec<IngestPool>;
    /// Records another router replica's pick for `worker` of pool `model`
    /// in its policy (`Policy::observe_remote`); nothing by default.
    fn observe_remote(&self, _model: &str, _worker: &str, _decided: &v1::Decided) {}
}

impl PoolDirectory for Pools {
    fn pool(&self, model: &str) -> Option<IngestPool> {
        self.get(model).map(|p| IngestPool::of(p))
    }
    fn pools(&self) -> Vec<IngestPool> {
        self.all().iter().map(|p| IngestPool::of(p)).collect()
    }
    fn observe_remote(&self, model: &str, worker: &str, decided: &v1::Decided) {
        if let Some(p) = self.get(model) {
            observe_remote(p, worker, decided);
        }
    }
}

/// Records another replica's `start` about `worker` in `pool`'s policy, by
/// the positions of its current snapshot (an id it does not know is skipped).
fn observe_remote(pool: &crate::pool::Pool, worker: &str, d: &v1::Decided) {
    use warmpath_core::policy::{HomeView, RemoteDecision};
    let state = pool.policy();
    let at = |id: &str| state.backends.iter().position(|b| b.id == id);
    let Some(backend) = at(worker) else {
        return;
    };
    let home = (!d.home.is_empty())
        .then(|| at(&d.home))
        .flatten()
        .map(|b| HomeView {
            backend: b,
            moved: d.home_moved,
            copies: d.copies.iter().filter_map(|c| at(c)).collect(),
        });
    state.policy.observe_remote(&RemoteDecision {
        prefix_key: d.prefix_key,
        backend,
        chain_blocks: d.chain_blocks,
        prefill_blocks: u32::try_from(d.prefill_blocks).unwrap_or(u32::MAX),
        home,
    });
}

/// Errors of the ingest server.
#[derive(Debug, Error)]
pub enum IngestError {
    /// The TLS certificate or key cannot be used (not PEM, key does not
    /// match, unsupported algorithm). Not retryable: fix the files.
    #[error("cannot serve TLS with the configured certificate and key: {0}")]
    Tls(String),
    /// The gRPC server failed (accept, transport). Retrying may work for
    /// transient socket errors.
    #[error("gRPC ingest server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// How agents prove who they are.
#[derive(Clone, Default)]
pub enum AgentAuth {
    /// Anyone who reaches the port may publish for any worker.
    #[default]
    Open,
    /// One token shared by every agent: any of them may publish for any worker.
    Shared(String),
    /// Each agent presents its worker's credential
    /// ([`warmpath_proto::worker_token`] of this secret): a stream may publish
    /// only for the worker its credential names.
    PerWorker(String),
}

impl AgentAuth {
    /// From the config's shared `token` and per-worker `secret` (validation
    /// refuses both at once; the secret wins here).
    pub fn new(token: Option<String>, secret: Option<String>) -> Self {
        match (secret, token) {
            (Some(s), _) => AgentAuth::PerWorker(s),
            (None, Some(t)) => AgentAuth::Shared(t),
            (None, None) => AgentAuth::Open,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            AgentAuth::Open => "open",
            AgentAuth::Shared(_) => "shared token",
            AgentAuth::PerWorker(_) => "per-worker credentials",
        }
    }
}

impl std::fmt::Debug for AgentAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The `CacheEvents` service.
#[derive(Clone)]
pub struct IngestService {
    dir: Arc<dyn PoolDirectory>,
    agents: Arc<Agents>,
    auth: AgentAuth,
    shutdown: CancellationToken,
    hello_within: Duration,
}

/// How long a new stream may take to send its Hello: a stream that never
/// does (any client can open one before the credential is checked against
/// the Hello) holds a task and a channel until then.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// How often a stream checks that it still owns its worker: a stream a
/// newer one took over (or whose worker was removed) is closed within this
/// even when its agent sends nothing more, with what it held.
const OWNER_CHECK: Duration = Duration::from_secs(1);

/// What a log line shows of a peer-chosen id: ids are checked after the
/// span that names them is built.
fn shown(id: &str) -> &str {
    let mut end = id.len().min(256);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    &id[..end]
}

impl std::fmt::Debug for IngestService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngestService")
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl IngestService {
    /// A service over `dir`, recording agents in `agents`.
    pub fn new(
        dir: Arc<dyn PoolDirectory>,
        agents: Arc<Agents>,
        auth: AgentAuth,
        shutdown: CancellationToken,
    ) -> Self {
        IngestService {
            dir,
            agents,
            auth,
            shutdown,
            hello_within: HELLO_WITHIN,
        }
    }

    /// The Hello deadline, shorter for tests.
    #[cfg(test)]
    pub(crate) fn with_hello_within(mut self, d: Duration) -> Self {
        self.hello_within = d;
        self
    }
}

/// A stream refused before its Hello: logged and counted under `reason`.
fn unauthenticated(remote: Option<std::net::SocketAddr>, why: &'static str) -> Status {
    metrics::counter!("warmpath_ingest_refused_total", "reason" => "auth").increment(1);
    tracing::warn!(remote = ?remote, "agent stream refused: {why}");
    Status::unauthenticated(why)
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
        let remote = request.remote_addr();
        // The credential a per-worker stream presented, checked against its
        // Hello's worker id once that arrives.
        let credential = match &self.auth {
            AgentAuth::Open => None,
            AgentAuth::Shared(token) => {
                if !warmpath_proto::check_bearer(request.metadata(), token) {
                    return Err(unauthenticated(remote, "missing or wrong agent token"));
                }
                None
            }
            AgentAuth::PerWorker(secret) => match warmpath_proto::bearer_token(request.metadata()) {
                Some(t) if t.starts_with("wp1-") => Some((secret.clone(), t.to_owned())),
                _ => {
                    return Err(unauthenticated(
                        remote,
                        "missing or malformed agent credential (warmpath-router --print-agent-token WORKER)",
                    ))
                }
            },
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<RouterMessage, Status>>(64);
        let dir = Arc::clone(&self.dir);
        let agents = Arc::clone(&self.agents);
        let shutdown = self.shutdown.clone();
        let hello_within = self.hello_within;
        // Owned by the stream: ends when the agent closes, the response
        // stream is dropped (send fails), the Hello is late or the router
        // shuts down.
        tokio::spawn(async move {
            let first = tokio::select! {
                m = tokio::time::timeout(hello_within, inbound.next()) => match m {
                    Ok(m) => m,
                    Err(_) => {
                        metrics::counter!("warmpath_ingest_refused_total", "reason" => "no_hello")
                            .increment(1);
                        let r = Refusal {
                            reason: format!("no Hello within {} ms", hello_within.as_millis()),
                            retryable: true,
                        };
                        tracing::info!(remote = ?remote, reason = %r.reason, "agent refused");
                        let _ = tx.try_send(Ok(refused(&r)));
                        return;
                    }
                },
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
            let span = tracing::info_span!("agent", worker = %shown(&hello.worker_id), model = %shown(&hello.model), epoch = hello.epoch);
            if let Some((secret, presented)) = &credential {
                let expected = warmpath_proto::worker_token(secret, &hello.worker_id);
                if !warmpath_proto::same_token(presented, &expected) {
                    let r = Refusal {
                        reason: format!(
                            "the agent credential does not name worker {:?}",
                            hello.worker_id
                        ),
                        retryable: false,
                    };
                    metrics::counter!("warmpath_ingest_refused_total", "reason" => "identity")
                        .increment(1);
                    span.in_scope(
                        || tracing::warn!(remote = ?remote, reason = %r.reason, "agent refused"),
                    );
                    let _ = tx.send(Ok(refused(&r))).await;
                    return;
                }
            }
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
    let mut ws = match WorkerStream::open(pool, Arc::clone(&agents), &hello, crate::monotonic_ms())
    {
        Ok(ws) => ws,
        Err(r) => {
            tracing::error!(reason = %r.reason, "agent refused");
            let _ = tx.send(Ok(refused(&r))).await;
            return;
        }
    };
    tracing::info!(block_size = hello.block_size, "agent connected");
    let peers = Arc::clone(agents.peers());
    let stream_id = ws.stream_id();
    peers.attach(&hello.model, &hello.worker_id, stream_id, tx.clone());
    let mut owner_check = tokio::time::interval(OWNER_CHECK);
    owner_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    'stream: loop {
        let next = tokio::select! {
            m = inbound.next() => m,
            () = shutdown.cancelled() => break,
            () = tx.closed() => break,
            _ = owner_check.tick() => {
                if ws.owns() {
                    continue;
                }
                // Answered as its next message would be: refused, and closed.
                Some(Ok(AgentMessage { msg: None }))
            }
        };
        let msg = match next {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                tracing::info!(error = %e, "agent stream broke");
                break;
            }
            None => break,
        };
        // Another replica's decision for this worker: counted here, recorded
        // by the pool's policy (ownership and liveness checked as for any
        // message).
        let decided = match &msg.msg {
            Some(Msg::Decided(d)) => Some(d.clone()),
            _ => None,
        };
        if let Some(d) = decided.filter(|_| ws.owns()) {
            if peers.receive(&hello.model, &hello.worker_id, stream_id, &d) {
                dir.observe_remote(&hello.model, &hello.worker_id, &d);
            }
        }
        match ws.on_message(msg, crate::monotonic_ms(), unix_micros()) {
            Ok(answers) => {
                for a in answers {
                    if tx.send(Ok(a)).await.is_err() {
                        break 'stream;
                    }
                }
            }
            Err(r) => {
                if r.retryable {
                    tracing::warn!(reason = %r.reason, "agent stream closed");
                } else {
                    tracing::error!(reason = %r.reason, "agent refused");
                }
                let _ = tx.send(Ok(refused(&r))).await;
                break;
            }
        }
    }
    peers.detach(&hello.model, &hello.worker_id, stream_id);
    ws.close();
    tracing::info!("agent disconnected");
}

/// The gRPC server, with TLS when `tls` holds a PEM certificate chain and
/// key. TLS is set up here, so an unusable identity fails before serving.
fn server(tls: Option<TlsPem>) -> Result<tonic::transport::Server, IngestError> {
    let builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .tcp_nodelay(true);
    match tls {
        None => Ok(builder),
        Some((cert, key)) => {
            let identity = tonic::transport::Identity::from_pem(cert, key);
            builder
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .map_err(|e| IngestError::Tls(error_chain(&e)))
        }
    }
}

/// Serves the ingest on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    service: IngestService,
    tls: Option<TlsPem>,
    shutdown: CancellationToken,
) -> Result<(), IngestError> {
    server(tls)?
        .add_service(CacheEventsServer::new(service))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// Starts the whole ingest on `listener`: the gRPC server (TLS when
/// `config.tls` is set) and the staleness sweeper (every second). An
/// unusable TLS identity fails here, before anything runs. Both tasks stop
/// when `shutdown` is cancelled; the caller owns the handles.
pub fn spawn(
    listener: TcpListener,
    dir: Arc<dyn PoolDirectory>,
    agents: Arc<Agents>,
    config: IngestConfig,
    shutdown: CancellationToken,
) -> Result<Vec<JoinHandle<()>>, IngestError> {
    let tls = config.tls.is_some();
    let router = server(config.tls)?.add_service(CacheEventsServer::new(IngestService::new(
        Arc::clone(&dir),
        agents,
        AgentAuth::new(config.token.clone(), config.secret.clone()),
        shutdown.clone(),
    )));
    tracing::info!(
        tls,
        auth = AgentAuth::new(config.token.clone(), config.secret.clone()).name(),
        stale_after_ms = config.stale_after.as_millis() as u64,
        drop_after_ms = config.drop_after.as_millis() as u64,
        "agent ingest starting"
    );
    let t = shutdown.clone();
    let serve = tokio::spawn(async move {
        let incoming = TcpListenerStream::new(listener);
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, t.cancelled_owned())
            .await
        {
            tracing::error!(error = %error_chain(&e), "gRPC ingest stopped");
        }
    });
    let sweeper = spawn_sweeper(
        dir,
        config.stale_after,
        config.drop_after,
        (config.stale_after / 2).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        shutdown,
    );
    Ok(vec![serve, sweeper])
}
