//! Wiring: one [`Agent`] = a follower per DP rank, a link per router, the load
//! scraper, the readiness watch and the HTTP server, under one cancellation token.
//! Data-parallel ranks 0..N-1 (on `port + rank`) are reported as ONE worker:
//! vLLM's DP front end picks the rank, so a router cannot target one.

use crate::cli::AgentConfig;
use crate::error::AgentError;
use crate::follow::{follow_rank, FollowConfig};
use crate::hub::Hub;
use crate::link::{Credential, Links};
use crate::load::scrape_loop;
use crate::ready::{self, Readiness};
use crate::stats::Stats;
use crate::tracker::EngineTracker;
use axum::extract::State;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warmpath_vllm_events::wire::endpoint_for_rank;

/// A running agent. Dropping it cancels everything; [`Agent::shutdown`] also
/// waits for the tasks.
#[derive(Debug)]
pub struct Agent {
    stats: Arc<Stats>,
    http_addr: SocketAddr,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Longest wait for one answer about a `dns://` router name.
const ROUTER_DNS_TIMEOUT: Duration = Duration::from_secs(2);
/// Removed-block mappings remembered per rank.
const GHOST_CAPACITY: usize = 1 << 16;

#[derive(Clone)]
struct HttpState {
    hub: Arc<Hub>,
    stats: Arc<Stats>,
    prometheus: Option<PrometheusHandle>,
    ready: Arc<Readiness>,
    worker_id: String,
    epoch: u64,
}

impl Agent {
    /// Validates `cfg`, binds the HTTP server and starts every task.
    /// `prometheus` renders `/metrics` (install the recorder once per process).
    pub async fn start(
        cfg: AgentConfig,
        prometheus: Option<PrometheusHandle>,
    ) -> Result<Agent, AgentError> {
        let has_token = cfg.agent_token.is_some() || cfg.agent_token_file.is_some();
        let invalid = if !(1..=256).contains(&cfg.worker_id.len()) {
            Some("--worker-id must be 1..=256 bytes")
        } else if cfg.model.is_empty() {
            Some("--model must not be empty")
        } else if cfg.events_silence.is_zero() {
            Some("--events-silence-ms must be at least 1")
        } else if cfg.dp_ranks == 0 {
            Some("--dp-ranks must be at least 1")
        } else if cfg.agent_token.is_some() && cfg.agent_token_file.is_some() {
            Some("--agent-token and --agent-token-file: give one")
        } else {
            None
        };
        if let Some(why) = invalid {
            return Err(AgentError::Config(why.into()));
        }
        if cfg.routers.is_empty() {
            tracing::warn!("no --router given: the agent tracks blocks but publishes nowhere");
        }
        if let Some(path) = &cfg.agent_token_file {
            crate::link::read_token_file(path).map_err(AgentError::Config)?;
        }
        let guard_token = has_token && !cfg.insecure;
        let (mut urls, mut dns_names) = (Vec::new(), Vec::new());
        for r in &cfg.routers {
            match crate::replicas::dns_target(r) {
                Some(t) => {
                    dns_names.push(t?);
                    if guard_token {
                        return Err(AgentError::Config(format!(
                            "--router {r}: its replicas are reached over plain http://, so the agent token would cross the network in plain text; pass --insecure (inside a trusted network) or list https:// routers"
                        )));
                    }
                }
                None if guard_token && crate::tls::plain_text_off_host(r) => {
                    return Err(AgentError::Config(format!(
                        "--router {r}: the agent token would cross the network in plain text; use https:// (the router's --agent-tls-cert), a loopback router, or pass --insecure"
                    )));
                }
                None => urls.push(r.clone()),
            }
        }
        // Built before anything is spawned: a bad system configuration fails the start.
        let dns_resolver = (!dns_names.is_empty())
            .then(|| warmpath_proto::dns::resolver(cfg.router_nameserver, ROUTER_DNS_TIMEOUT))
            .transpose()
            .map_err(|e| AgentError::Config(format!("--router dns://: {e}")))?
            .map(Arc::new);
        let router_tls =
            crate::tls::router_tls(&urls, cfg.router_ca.as_deref(), cfg.tls_domain.as_deref())?;
        let mut ranks = Vec::new();
        for r in 0..cfg.dp_ranks {
            let endpoint = endpoint_for_rank(&cfg.kv_events, r).ok_or_else(|| {
                AgentError::Config(format!(
                    "cannot derive rank {r}'s endpoint from {} (needs tcp://host:port)",
                    cfg.kv_events
                ))
            })?;
            let replay = cfg.kv_replay.as_ref().map(|rep| {
                endpoint_for_rank(rep, r).ok_or_else(|| {
                    AgentError::Config(format!(
                        "cannot derive rank {r}'s replay endpoint from {rep}"
                    ))
                })
            });
            ranks.push(FollowConfig {
                endpoint,
                replay_endpoint: replay.transpose()?,
                topic: cfg.topic.clone(),
                rank: r,
            });
        }
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let hub = Arc::new(Hub::default());
        let stats = Arc::new(Stats::default());
        crate::series::describe();
        let readiness = Arc::new(Readiness::new(!cfg.load_interval.is_zero()));
        let cancel = CancellationToken::new();
        let mut tasks = Vec::new();

        let listen_failed =
            |e: std::io::Error| AgentError::Config(format!("--listen {}: {e}", cfg.listen));
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(listen_failed)?;
        let http_addr = listener.local_addr().map_err(listen_failed)?;
        let state = HttpState {
            hub: hub.clone(),
            stats: stats.clone(),
            prometheus,
            ready: readiness.clone(),
            worker_id: cfg.worker_id.clone(),
            epoch,
        };
        let app = Router::new()
            .route("/metrics", get(metrics_page))
            .route("/livez", get(livez))
            .route("/readyz", get(health))
            .route("/health", get(health))
            .with_state(state);
        let server = crate::serve::serve(listener, app, cfg.http, cancel.child_token());
        tasks.push(tokio::spawn(server));

        let (restart_tx, restart_rx) = watch::channel(0u64);
        for fc in ranks {
            tasks.push(tokio::spawn(follow_rank(
                fc,
                EngineTracker::new(cfg.model.clone(), GHOST_CAPACITY),
                hub.clone(),
                stats.clone(),
                restart_rx.clone(),
                cancel.child_token(),
            )));
        }

        let (load_tx, load_rx) = watch::channel(None);
        if !cfg.load_interval.is_zero() {
            tasks.push(tokio::spawn(scrape_loop(
                cfg.engine_url.clone(),
                cfg.load_interval,
                load_tx,
                restart_tx,
                readiness.clone(),
                cancel.child_token(),
            )));
        }
        let watch_every = Some(cfg.load_interval).filter(|d| !d.is_zero());
        tasks.push(tokio::spawn(ready::watch(
            readiness,
            stats.clone(),
            watch_every.unwrap_or(Duration::from_secs(1)),
            cfg.events_silence,
            cfg.kv_events.clone(),
            cancel.child_token(),
        )));
        let links = Arc::new(Links {
            worker_id: cfg.worker_id.clone(),
            endpoint: cfg.engine_url.clone(),
            model: cfg.model.clone(),
            epoch,
            token: (cfg.agent_token_file.clone().map(Credential::File))
                .or(cfg.agent_token.clone().map(Credential::Token)),
            tls: router_tls,
            hub: hub.clone(),
            load: load_rx.clone(),
            stats: stats.clone(),
            cfg: cfg.link.clone(),
        });
        for url in urls {
            tasks.push(links.start(url, &cancel).task);
        }
        if let Some(resolver) = dns_resolver {
            for (name, port) in dns_names {
                tasks.push(tokio::spawn(crate::replicas::follow_dns(
                    Arc::clone(&links),
                    name,
                    port,
                    Arc::clone(&resolver),
                    cfg.router_dns_interval,
                    cancel.child_token(),
                )));
            }
        }
        tracing::info!(worker_id = %cfg.worker_id, %http_addr, routers = cfg.routers.len(), ranks = cfg.dp_ranks, "agent started");
        Ok(Agent {
            stats,
            http_addr,
            cancel,
            tasks,
        })
    }

    /// The bound address of `/metrics` and `/health`.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Stops every task and waits for them.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }
}

async fn metrics_page(State(s): State<HttpState>) -> String {
    s.prometheus.map(|p| p.render()).unwrap_or_default()
}

/// `/livez`: the agent's HTTP server runs.
async fn livez() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"status": "ok"}))
}

/// `/readyz` and `/health`: 200 when [`crate::ready`] says ready, else 503
/// with the reasons; the body also carries the agent's counters.
async fn health(State(s): State<HttpState>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let not_ready = s.ready.not_ready(&s.stats);
    let status = if not_ready.is_empty() {
        axum::http::StatusCode::OK
    } else {
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    };
    let (seq, blocks, block_size) = s.hub.status();
    let body = axum::Json(serde_json::json!({
        "status": if not_ready.is_empty() { "ok" } else { "unavailable" },
        "not_ready": not_ready,
        "router_streams": s.stats.router_streams.get(),
        "worker_id": s.worker_id,
        "epoch": s.epoch,
        "seq": seq,
        "blocks": blocks,
        "block_size": block_size,
        "batches": s.stats.batches.get(),
        "bad_messages": s.stats.bad_frames.get() + s.stats.bad_payloads.get(),
        "unknown_parents": s.stats.unknown_parents.get(),
        "gaps": s.stats.gaps.get(),
        "gaps_unrecovered": s.stats.gaps_unrecovered.get(),
        "engine_restarts": s.stats.engine_restarts.get(),
        "event_reconnects": s.stats.event_reconnects.get(),
        "router_connects": s.stats.router_connects.get(),
        "router_refusals": s.stats.router_refusals.get(),
    }));
    (status, body).into_response()
}
