//! One router link: a `CacheEvents.Publish` stream (Hello, snapshot, deltas,
//! load, heartbeats) reconnecting with jittered back-off (docs/agent.md).

use crate::hub::{Hub, Sink, Work};
use crate::stats::Stats;
use metrics::{counter, gauge};
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::ClientTlsConfig;
use warmpath_proto::error_chain;
use warmpath_proto::v1::{
    agent_message::Msg, router_message, AgentMessage, Heartbeat, Hello, Load,
};
use warmpath_proto::{bearer, CacheEventsClient, AUTHORIZATION};

/// Snapshots a router asks for go out at most one per this long per stream
/// (later asks wait): each is built under the hub's lock, which a router asking
/// in a loop would otherwise hold.
const RESEND_SPACING: Duration = Duration::from_secs(1);

/// What the agent sends as `authorization: Bearer ...` (no `Debug`: never logged).
#[derive(Clone)]
pub(crate) enum Credential {
    /// A fixed token: the worker's credential or the routers' shared token.
    Token(String),
    /// A file read at every connect, as a projected ServiceAccount token
    /// rotates under the agent.
    File(std::path::PathBuf),
}

/// A token file longer than this is not a token.
const MAX_TOKEN_FILE: u64 = 64 * 1024;

impl Credential {
    /// The token to send now.
    fn current(&self) -> Result<String, LinkError> {
        match self {
            Credential::Token(t) => Ok(t.clone()),
            Credential::File(path) => read_token_file(path).map_err(LinkError::Connect),
        }
    }
}

/// The token in `path`, trimmed; the error says what is wrong with it.
pub(crate) fn read_token_file(path: &std::path::Path) -> Result<String, String> {
    let fail = |why: String| format!("--agent-token-file {}: {why}", path.display());
    let bytes = warmpath_proto::files::read_bounded(path, MAX_TOKEN_FILE).map_err(fail)?;
    let text = String::from_utf8(bytes).map_err(|e| fail(e.to_string()))?;
    match text.trim() {
        "" => Err(fail("the file is empty".into())),
        t => Ok(t.to_owned()),
    }
}

/// Link tuning.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// Heartbeat after this long without sending.
    pub heartbeat: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Connect timeout; also how long the router may take to answer a new
    /// stream.
    pub connect_timeout: Duration,
    /// How long one message may wait for the router to take it (HTTP/2
    /// flow control), and a keep-alive ping for its answer: past either the
    /// router is taken as hung and the link reconnects.
    pub stall_timeout: Duration,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            heartbeat: Duration::from_secs(2),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(3),
            stall_timeout: Duration::from_secs(10),
        }
    }
}

/// Why one stream ended.
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("TLS with the router failed (check --router-ca and --tls-domain): {0}")]
    Tls(String),
    #[error("stream failed: {0}")]
    Stream(#[from] tonic::Status),
    #[error("router refused the stream: {0}")]
    Refused(String),
    #[error("router closed the stream")]
    Closed,
    #[error("router stopped {0} for {1:?}: taken as hung")]
    Stalled(&'static str, Duration),
}

/// What every link of this agent shares: who it is (as told in Hello), its
/// credential and TLS settings, the hub, load and counters, the tuning.
pub(crate) struct Links {
    pub(crate) worker_id: String,
    /// Engine base URL.
    pub(crate) endpoint: String,
    pub(crate) model: String,
    pub(crate) epoch: u64,
    pub(crate) token: Option<Credential>,
    pub(crate) tls: Option<ClientTlsConfig>,
    pub(crate) hub: Arc<Hub>,
    pub(crate) load: watch::Receiver<Option<Load>>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) cfg: LinkConfig,
}

/// Deltas queued per router before coalescing into a snapshot.
const ROUTER_QUEUE: usize = 16_384;

/// One running link: its queue, its cancellation, its task.
#[derive(Debug)]
pub(crate) struct Running {
    sink: Arc<Sink>,
    cancel: CancellationToken,
    pub(crate) task: JoinHandle<()>,
}

impl Links {
    /// Starts a link to `url` (ends when `parent` is cancelled).
    pub(crate) fn start(self: &Arc<Self>, url: String, parent: &CancellationToken) -> Running {
        let sink = self.hub.add_sink(url.clone(), ROUTER_QUEUE);
        let cancel = parent.child_token();
        let link = run_link(url, Arc::clone(self), Arc::clone(&sink), cancel.clone());
        let task = tokio::spawn(link);
        Running { sink, cancel, task }
    }

    /// Stops a link and drops its queue.
    pub(crate) async fn stop(&self, r: Running) {
        r.cancel.cancel();
        let _ = r.task.await;
        self.hub.remove_sink(&r.sink);
        gauge!("warmpath_agent_router_connected", "router" => r.sink.name.clone()).set(0.0);
    }
}

/// Runs the link to `url` until `cancel` fires.
pub(crate) async fn run_link(
    url: String,
    links: Arc<Links>,
    sink: Arc<Sink>,
    cancel: CancellationToken,
) {
    let (stats, cfg) = (&links.stats, &links.cfg);
    let mut attempt: u32 = 0;
    loop {
        let started = std::time::Instant::now();
        let r = tokio::select! {
            _ = cancel.cancelled() => return,
            r = stream_once(&url, &links, &sink) => r,
        };
        gauge!("warmpath_agent_router_connected", "router" => url.clone()).set(0.0);
        match r {
            Err(LinkError::Refused(reason)) => {
                tracing::error!(router = %url, %reason, "router refused this agent");
            }
            Err(LinkError::Stream(s)) if s.code() == tonic::Code::Unauthenticated => {
                stats.router_refusals.inc();
                counter!("warmpath_agent_router_refused_total", "router" => url.clone())
                    .increment(1);
                tracing::error!(router = %url, reason = %s.message(), "router refused this agent's token (check --agent-token)");
            }
            Err(e @ LinkError::Tls(_)) => {
                counter!("warmpath_agent_router_tls_failures_total", "router" => url.clone())
                    .increment(1);
                tracing::error!(router = %url, error = %e, "router link down");
            }
            Err(e) => tracing::warn!(router = %url, error = %e, "router link down"),
            Ok(()) => {}
        }
        if started.elapsed() > Duration::from_secs(10) {
            attempt = 0; // it was up for a while: start backing off afresh
        }
        let cap = cfg
            .backoff_min
            .saturating_mul(1u32 << attempt.min(16))
            .min(cfg.backoff_max);
        let wait = cap.mul_f64(rand::rng().random_range(0.5..1.0));
        attempt = attempt.saturating_add(1);
        counter!("warmpath_agent_router_reconnects_total", "router" => url.clone()).increment(1);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// `load` with `partial` set from what `hub` knows now.
fn with_partial(mut l: Load, hub: &Hub) -> Load {
    l.partial = crate::load::view_is_partial(&l, hub.status().1 as u64);
    l
}

fn hello(id: &Links, load: Option<Load>) -> Msg {
    let hub = &id.hub;
    Msg::Hello(Hello {
        worker_id: id.worker_id.clone(),
        endpoint: id.endpoint.clone(),
        model: id.model.clone(),
        block_size: hub.block_size().unwrap_or(0),
        epoch: id.epoch,
        agent_version: concat!("warmpath-agent ", env!("CARGO_PKG_VERSION")).to_owned(),
        dp_rank: 0,
        partial: load.is_some_and(|l| with_partial(l, hub).partial),
    })
}

async fn stream_once(url: &str, links: &Links, sink: &Sink) -> Result<(), LinkError> {
    let (hub, stats, cfg) = (&*links.hub, &*links.stats, &links.cfg);
    let mut load = links.load.clone();
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(|e| LinkError::Connect(error_chain(&e)))?
        .connect_timeout(cfg.connect_timeout)
        .http2_keep_alive_interval(cfg.heartbeat)
        .keep_alive_timeout(cfg.stall_timeout)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    let tls = crate::tls::is_https(url);
    if tls {
        let t = links.tls.clone().unwrap_or_default();
        endpoint = endpoint
            .tls_config(t)
            .map_err(|e| LinkError::Tls(error_chain(&e)))?;
    }
    let channel = endpoint.connect().await.map_err(|e| {
        let why = error_chain(&e);
        // rustls' verdicts (UnknownIssuer, NotValidForName, ...) name the
        // certificate; a plain refused connection does not.
        if tls && (why.contains("certificate") || why.contains("tls") || why.contains("TLS")) {
            LinkError::Tls(why)
        } else {
            LinkError::Connect(why)
        }
    })?;
    let mut client = CacheEventsClient::new(channel);
    let (tx, rx) = mpsc::channel::<AgentMessage>(32);
    let stall = cfg.stall_timeout;
    let send = |m: Msg| {
        let tx = tx.clone();
        async move {
            let m = AgentMessage { msg: Some(m) };
            match tokio::time::timeout(stall, tx.send(m)).await {
                Ok(r) => r.map_err(|_| LinkError::Closed),
                Err(_) => Err(LinkError::Stalled("reading the stream", stall)),
            }
        }
    };
    // Queue Hello + snapshot before the call so the router sees them first.
    sink.request_snapshot();
    sink.clear_decided();
    let now = *load.borrow();
    send(hello(links, now)).await?;
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(t) = &links.token {
        let v = bearer(&t.current()?)
            .parse()
            .map_err(|_| LinkError::Connect("agent token is not valid header text".into()))?;
        req.metadata_mut().insert(AUTHORIZATION, v);
    }
    let mut inbound = tokio::time::timeout(cfg.connect_timeout, client.publish(req))
        .await
        .map_err(|_| LinkError::Stalled("answering a new stream", cfg.connect_timeout))??
        .into_inner();
    stats.router_connects.inc();
    // Counted up while this stream lives (readiness), whichever way it ends.
    let _up = stats.router_streams.hold();
    gauge!("warmpath_agent_router_connected", "router" => url.to_owned()).set(1.0);
    tracing::info!(router = %url, "router link up");
    let mut heartbeat = tokio::time::interval(cfg.heartbeat);
    let mut last_seq = 0u64;
    let mut load_open = true;
    // When the router may next be sent a snapshot it asked for, and whether
    // one it asked for waits for that.
    let mut resend_at = tokio::time::Instant::now();
    let mut resend_waits = false;
    loop {
        // Drain all work first.
        while let Some(work) = hub.take_work(sink) {
            match work {
                Work::Hello => {
                    let now = *load.borrow();
                    send(hello(links, now)).await?
                }
                Work::Snapshot {
                    seq,
                    blocks,
                    prefix_closed,
                } => {
                    for chunk in warmpath_proto::snapshot_chunks(seq, &blocks, prefix_closed) {
                        send(Msg::Snapshot(chunk)).await?;
                    }
                    last_seq = seq;
                    counter!("warmpath_agent_snapshots_sent_total").increment(1);
                }
                Work::Decided(ds) => {
                    for d in ds {
                        send(Msg::Decision(d)).await?;
                    }
                }
                Work::Deltas(ds) => {
                    let n = ds.len() as u64;
                    for d in ds {
                        last_seq = d.seq;
                        send(Msg::Delta(d)).await?;
                    }
                    counter!("warmpath_agent_deltas_sent_total").increment(n);
                }
            }
            heartbeat.reset();
        }
        tokio::select! {
            _ = sink.notify.notified() => {}
            changed = load.changed(), if load_open => {
                if changed.is_err() {
                    load_open = false; // no scraper
                } else {
                    let l = *load.borrow_and_update();
                    if let Some(l) = l {
                        send(Msg::Load(with_partial(l, hub))).await?;
                    }
                }
            }
            _ = tokio::time::sleep_until(resend_at), if resend_waits => {
                resend_waits = false;
                resend_at = tokio::time::Instant::now() + RESEND_SPACING;
                sink.request_snapshot();
            }
            _ = heartbeat.tick() => {
                send(Msg::Heartbeat(Heartbeat { last_seq })).await?;
            }
            m = inbound.next() => match m {
                None => return Err(LinkError::Closed),
                Some(Err(s)) => return Err(LinkError::Stream(s)),
                Some(Ok(m)) => match m.msg {
                    Some(router_message::Msg::Ack(a)) => {
                        tracing::trace!(router = %url, seq = a.seq, "ack");
                    }
                    Some(router_message::Msg::Decision(d)) => {
                        // A decision of this router for our worker: every
                        // other router hears of it (router replicas), in
                        // the bytes it came in.
                        hub.share(sink, &d);
                        counter!("warmpath_agent_decisions_shared_total").increment(1);
                    }
                    Some(router_message::Msg::ResendSnapshot(r)) => {
                        let now = tokio::time::Instant::now();
                        if now >= resend_at {
                            tracing::warn!(router = %url, reason = %r.reason, "router asks for a snapshot");
                            resend_at = now + RESEND_SPACING;
                            sink.request_snapshot();
                        } else if !resend_waits {
                            tracing::warn!(router = %url, reason = %r.reason, "router asks for another snapshot within 1 s: it waits");
                            resend_waits = true;
                        }
                        if resend_waits {
                            counter!("warmpath_agent_snapshot_requests_deferred_total", "router" => url.to_owned()).increment(1);
                        }
                    }
                    Some(router_message::Msg::Refused(r)) => {
                        stats.router_refusals.inc();
                        counter!("warmpath_agent_router_refused_total", "router" => url.to_owned()).increment(1);
                        if r.reason.contains("block size") || r.reason.contains("block_size") {
                            counter!("warmpath_agent_block_size_mismatch_total").increment(1);
                        }
                        return Err(LinkError::Refused(r.reason));
                    }
                    None => {}
                },
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    #[test]
    fn a_token_file_is_read_at_every_connect_and_bad_ones_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let cred = Credential::File(path.clone());
        let missing = cred.current().unwrap_err().to_string();
        assert!(missing.contains("--agent-token-file"), "{missing}");
        std::fs::write(&path, "first.token.a\n").unwrap();
        assert_eq!(cred.current().unwrap(), "first.token.a");
        // The kubelet rotated it: the next connect sends the new one.
        std::fs::write(&path, "second.token.b").unwrap();
        assert_eq!(cred.current().unwrap(), "second.token.b");
        std::fs::write(&path, " \n").unwrap();
        assert!(cred.current().unwrap_err().to_string().contains("empty"));
        std::fs::write(&path, vec![b'a'; 70_000]).unwrap();
        assert!(cred
            .current()
            .unwrap_err()
            .to_string()
            .contains("too large"));
    }

    /// A "router" that accepts connections and never answers: the link
    /// gives up on each stream at its deadline and connects again.
    #[tokio::test]
    async fn a_router_that_never_answers_is_left_and_retried() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&accepted);
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                seen.fetch_add(1, Ordering::SeqCst);
                held.push(sock);
            }
        });
        let hub = Arc::new(Hub::default());
        let sink = hub.add_sink("r", 64);
        let (_load_tx, load) = watch::channel(None);
        let cfg = LinkConfig {
            heartbeat: Duration::from_millis(100),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(20),
            connect_timeout: Duration::from_millis(300),
            stall_timeout: Duration::from_millis(300),
        };
        let links = Arc::new(Links {
            worker_id: "w".into(),
            endpoint: "http://127.0.0.1:1".into(),
            model: "m".into(),
            epoch: 1,
            token: None,
            tls: None,
            hub,
            load,
            stats: Arc::new(Stats::default()),
            cfg,
        });
        let cancel = CancellationToken::new();
        let link = tokio::spawn(run_link(
            format!("http://{addr}"),
            links,
            sink,
            cancel.clone(),
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while accepted.load(Ordering::SeqCst) < 3 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            accepted.load(Ordering::SeqCst) >= 3,
            "the link waited on a silent router"
        );
        cancel.cancel();
        link.await.unwrap();
        server.abort();
    }
}
