//! The gRPC ingest: agents publish their workers' block sets here and this
//! module applies them to each pool's index (docs/agent.md, docs/hostile-edges-ingest.md).

mod agents;
mod auth;
mod directory;
mod drive;
mod error;
mod guard;
mod identity;
mod pace;
pub(crate) mod peers;
#[cfg(feature = "kubernetes")]
pub(crate) mod pods;
mod stream;
mod sweeper;
#[cfg(test)]
mod tests;

pub use agents::{AgentStatus, Agents};
pub use auth::AgentAuth;
pub use directory::{IngestPool, PoolDirectory};
pub use error::IngestError;
#[cfg(feature = "kubernetes")]
pub use pods::PodTokens;
pub use sweeper::set_memory_release;
// The settings are configuration (`config::ingest`); re-exported for embedders.
use crate::config::RouterConfig;
pub use crate::config::TlsPem;

use guard::{shown, Admission};
use pace::Gates;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use stream::Refusal;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;
use warmpath_edge::LogEvery;
use warmpath_proto::error_chain;
use warmpath_proto::v1::{agent_message::Msg, AgentMessage, RouterMessage};
use warmpath_proto::{CacheEvents, CacheEventsServer};

/// The `CacheEvents` service.
#[derive(Clone)]
pub struct IngestService {
    dir: Arc<dyn PoolDirectory>,
    agents: Arc<Agents>,
    auth: AgentAuth,
    pods: identity::Pods,
    shutdown: CancellationToken,
    hello_within: Duration,
    /// Streams not yet authenticated, by peer address.
    admission: Arc<Admission>,
    /// Shared with the sweeper: one index job per pool at a time.
    gates: Arc<Gates>,
    /// Refusals of unauthenticated peers: one line every 10 s.
    refusals: Arc<LogEvery>,
    /// Streams that never sent their Hello: one line every 10 s.
    silent: Arc<LogEvery>,
}

/// How long a new stream may take to send its Hello (until then it holds a
/// task, and anyone can open one).
const HELLO_WITHIN: Duration = Duration::from_secs(10);

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
            pods: None,
            shutdown,
            hello_within: HELLO_WITHIN,
            admission: Arc::new(Admission::default()),
            gates: Arc::default(),
            refusals: Arc::default(),
            silent: Arc::default(),
        }
    }

    /// Counts and logs (at most every 10 s) a stream refused before its Hello.
    fn refuse(&self, remote: Option<std::net::SocketAddr>, reason: &'static str, why: &str) {
        metrics::counter!("warmpath_ingest_refused_total", "reason" => reason).increment(1);
        if let Some(suppressed) = self.refusals.ready() {
            tracing::warn!(remote = ?remote, suppressed, "agent stream refused: {why} (refusals are logged at most every 10 s)");
        }
    }

    /// The Hello deadline, shorter for tests.
    #[cfg(test)]
    pub(crate) fn with_hello_within(mut self, d: Duration) -> Self {
        self.hello_within = d;
        self
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
        // Checked against its Hello's worker id once that arrives.
        let credential = match identity::presented(&self.auth, &self.pods, request.metadata()) {
            Ok(c) => c,
            Err(why) => {
                self.refuse(remote, "auth", why);
                return Err(Status::unauthenticated(why));
            }
        };
        // Held until the Hello is checked: a peer's unauthenticated streams are capped.
        let ticket = match self.admission.admit(remote) {
            Ok(t) => t,
            Err(full) => {
                self.refuse(remote, "streams", &full.to_string());
                return Err(Status::resource_exhausted(full.to_string()));
            }
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<RouterMessage, Status>>(64);
        let sh = drive::Shared {
            dir: Arc::clone(&self.dir),
            agents: Arc::clone(&self.agents),
            gates: Arc::clone(&self.gates),
            refusals: Arc::clone(&self.refusals),
            shutdown: self.shutdown.clone(),
        };
        let shutdown = self.shutdown.clone();
        let silent = Arc::clone(&self.silent);
        let hello_within = self.hello_within;
        // Ends when the agent closes, the answer stream is dropped, the Hello
        // is late or the router shuts down.
        tokio::spawn(async move {
            let first = tokio::select! {
                m = tokio::time::timeout(hello_within, inbound.next()) => match m {
                    Ok(m) => m,
                    Err(_) => {
                        metrics::counter!("warmpath_ingest_refused_total", "reason" => "no_hello")
                            .increment(1);
                        let r = Refusal::retry(format!("no Hello within {} ms", hello_within.as_millis()));
                        if let Some(suppressed) = silent.ready() {
                            tracing::info!(remote = ?remote, reason = %r.reason, suppressed, "agent refused (logged at most every 10 s)");
                        }
                        let _ = tx.try_send(Ok(r.answer()));
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
                    let r = Refusal::retry("the first message must be Hello");
                    let _ = tx.send(Ok(r.answer())).await;
                    return;
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "agent stream failed before Hello");
                    return;
                }
                None => return,
            };
            // Peer-chosen strings: escaped and cut, so no log line is forged.
            let span = tracing::info_span!("agent", worker = %shown(&hello.worker_id), model = %shown(&hello.model), epoch = hello.epoch);
            if let Err(r) = credential.check(&hello.worker_id).await {
                metrics::counter!("warmpath_ingest_refused_total", "reason" => "identity")
                    .increment(1);
                if let Some(suppressed) = sh.refusals.ready() {
                    span.in_scope(|| tracing::warn!(remote = ?remote, reason = %r.reason, suppressed, "agent refused (refusals are logged at most every 10 s)"));
                }
                let _ = tx.send(Ok(r.answer())).await;
                return;
            }
            drop(ticket);
            drive::drive(sh, hello, inbound, tx).instrument(span).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx)) as Out))
    }
}

/// The gRPC server, with TLS when `tls` is set (an unusable identity fails here).
fn server(tls: Option<TlsPem>) -> Result<tonic::transport::Server, IngestError> {
    let builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .max_concurrent_streams(Some(guard::MAX_STREAMS_PER_CONNECTION))
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

/// Starts the whole ingest on `listener` as `config` says: the gRPC server
/// and the staleness sweeper, until `shutdown`. An unusable TLS identity
/// fails here, before anything runs.
pub fn spawn(
    listener: TcpListener,
    dir: Arc<dyn PoolDirectory>,
    agents: Arc<Agents>,
    config: &RouterConfig,
    shutdown: CancellationToken,
) -> Result<Vec<JoinHandle<()>>, IngestError> {
    spawn_reviewing(listener, dir, agents, config, None, shutdown)
}

/// [`spawn`], taking agents' pod tokens too when `pods` reviews them.
pub fn spawn_reviewing(
    listener: TcpListener,
    dir: Arc<dyn PoolDirectory>,
    agents: Arc<Agents>,
    config: &RouterConfig,
    pods: identity::Pods,
    shutdown: CancellationToken,
) -> Result<Vec<JoinHandle<()>>, IngestError> {
    let settings = &config.ingest;
    let pem = settings
        .load_tls()
        .map_err(|e| IngestError::Tls(e.to_string()))?;
    let tls = pem.is_some();
    let gates = Arc::new(Gates::default());
    let auth = AgentAuth::new(config.agent_secret.clone());
    let auth_name = auth.name();
    let mut service = IngestService::new(Arc::clone(&dir), agents, auth, shutdown.clone());
    // One index job per pool at a time, shared with the sweeper.
    service.gates = Arc::clone(&gates);
    service.pods = pods;
    let pod_tokens = service.pods.is_some();
    let router = server(pem)?.add_service(CacheEventsServer::new(service));
    tracing::info!(
        tls,
        auth = auth_name,
        pod_tokens,
        stale_after_ms = settings.stale_after_ms,
        cleared_after_ms = settings.drop_after().as_millis() as u64,
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
    let sweeper = sweeper::spawn_gated(
        dir,
        settings.stale_after(),
        settings.drop_after(),
        shutdown,
        gates,
    );
    Ok(vec![serve, sweeper])
}
