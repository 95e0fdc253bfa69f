//! Start-up: build pools, bind, serve HTTP ([`crate::http::front`] before the
//! routes of [`app`]) and run the background tasks, owned by [`RunningRouter`].

use crate::api::{models, responses};
use crate::config::RouterConfig;
use crate::control::state::Shared;
use crate::control::{admin, health, inspect, metrics, readiness, ui};
use crate::http::conn::{ConnLimits, Conns};
use crate::http::error::{ApiError, RouterError};
use crate::http::front;
use crate::ingest;
use crate::routing::pool::Pools;
use axum::routing::{any, get, post};
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warmpath_edge::open_file_share;

/// The HTTP routes over `shared` other than the proxied endpoints.
pub(crate) fn app(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/models", get(models::models))
        .route("/livez", get(readiness::livez))
        .route("/readyz", get(readiness::readyz))
        .route("/health", get(readiness::readyz))
        .route("/metrics", get(inspect::metrics))
        .route("/cache-index", get(inspect::cache_index))
        .route("/cache-index/query", post(inspect::query))
        .route("/cache-index/ui", get(ui::page))
        .route("/v1/responses/{id}", get(responses::get))
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/admin/pools/{*rest}", any(admin::handle))
        .fallback(|uri: axum::http::Uri| async move {
            ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "not_found",
                format!("no route for {}", uri.path()),
            )
        })
        .with_state(shared)
}

/// A started router; dropping it (or cancelling `start`'s token) shuts it down.
#[derive(Debug)]
pub struct RunningRouter {
    /// The bound HTTP address (port resolved when 0 was asked for).
    pub http_addr: SocketAddr,
    /// The bound gRPC address, when the agent ingest runs.
    pub grpc_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    token: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// The configuration it started with, to tell a reload what it cannot apply.
    started_with: RouterConfig,
}

impl RunningRouter {
    /// The cache index of pool `model`, e.g. to fill it in-process.
    pub fn index(&self, model: &str) -> Option<Arc<warmpath_core::CacheIndex>> {
        self.shared.pools.get(model).map(|p| Arc::clone(&p.index))
    }

    /// Applies a re-read configuration; returns what was applied, then what was not.
    pub async fn reload(&self, config: &RouterConfig) -> Result<Vec<String>, RouterError> {
        let mut report = admin::reload(&self.shared, config).await?;
        report
            .ignored
            .extend(admin::restart_only_changes(&self.started_with, config));
        for c in &report.applied {
            tracing::info!("reload: {c}");
        }
        if !report.ignored.is_empty() {
            tracing::warn!(
                "reload: not applied: {} (ignored)",
                report.ignored.join("; ")
            );
        }
        report.applied.extend(report.ignored);
        Ok(report.applied)
    }

    /// Starts the shutdown (docs/operations.md); [`RunningRouter::wait`] returns after it.
    pub fn shutdown(&self) {
        self.shared.start_draining();
        self.token.cancel();
    }

    /// Waits until the server and background tasks have stopped.
    pub async fn wait(mut self) {
        for t in std::mem::take(&mut self.tasks) {
            if let Err(e) = t.await {
                tracing::error!(error = %e, "router task failed");
            }
        }
    }
}

impl Drop for RunningRouter {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// Validates `config`, builds the pools, binds and serves until `shutdown`.
pub async fn start(
    config: RouterConfig,
    shutdown: CancellationToken,
) -> Result<RunningRouter, RouterError> {
    config.validate()?;
    let metrics = metrics::install();
    let pools_cfg = config.pools.clone();
    let pools = tokio::task::spawn_blocking(move || Pools::build(&pools_cfg))
        .await
        .map_err(|e| {
            RouterError::Config(crate::config::invalid(
                "pools",
                format!("loading panicked: {e}"),
            ))
        })??;
    let pools = Arc::new(pools);
    let agents = config
        .grpc_listen
        .as_ref()
        .map(|_| Arc::new(ingest::Agents::default()));
    if let Some(a) = &agents {
        a.peers.set_enabled(config.ingest.share_decisions);
        if let Some(secret) = &config.agent_secret {
            a.peers.sign_with(warmpath_proto::fact_key(secret));
        }
    }
    let shared = Arc::new(Shared::new(
        &config,
        Arc::clone(&pools),
        metrics,
        agents.clone(),
    ));
    let bind = |addr: &String| {
        let addr = addr.clone();
        async move {
            let l = TcpListener::bind(&addr)
                .await
                .map_err(|source| RouterError::Bind {
                    addr: addr.clone(),
                    source,
                })?;
            let a = l
                .local_addr()
                .map_err(|source| RouterError::Bind { addr, source })?;
            Ok::<_, RouterError>((l, a))
        }
    };
    let (listener, http_addr) = bind(&config.listen).await?;
    // The background tasks stop after the front drained (the index stays fed).
    let token = shutdown.child_token();
    let background = CancellationToken::new();
    let mut tasks = Vec::new();
    let mut grpc_addr = None;
    if let (Some(g), Some(agents)) = (&config.grpc_listen, &agents) {
        let (l, addr) = bind(g).await?;
        grpc_addr = Some(addr);
        let dir: Arc<dyn ingest::PoolDirectory> = pools;
        #[cfg(feature = "kubernetes")]
        let pods = match &config.ingest.pod_token_audience {
            Some(audience) => Some(ingest::PodTokens::connect(audience).await.map_err(|e| {
                RouterError::Config(crate::config::invalid(
                    "ingest.pod_token_audience",
                    e.to_string(),
                ))
            })?),
            None => None,
        };
        #[cfg(not(feature = "kubernetes"))]
        let pods = None;
        let started = ingest::spawn_reviewing(
            l,
            dir,
            Arc::clone(agents),
            &config,
            pods,
            background.clone(),
        )
        .map_err(|e| {
            RouterError::Config(crate::config::invalid("ingest.tls_cert", e.to_string()))
        })?;
        tasks.extend(started);
    }
    // Probe once before serving, so that /readyz tells the truth at once.
    crate::control::discovery::first_round(&shared).await;
    health::spread(&shared, Duration::ZERO).await;
    let router = app(Arc::clone(&shared));
    let sv = &config.server;
    let max_connections = sv.max_connections.unwrap_or_else(|| open_file_share(80));
    let conns = Conns::new(ConnLimits {
        header_timeout: Duration::from_millis(sv.header_timeout_ms),
        keepalive_idle: sv.keepalive_idle(),
        max_connections,
        send_timeout: sv.send_timeout(),
    });
    let serving = front::serve(listener, Arc::clone(&shared), router, conns, token.clone());
    let stop_background = background.clone();
    tasks.push(tokio::spawn(async move {
        serving.await;
        stop_background.cancel();
    }));
    tasks.push(tokio::spawn(health::run(
        Arc::clone(&shared),
        background.clone(),
    )));
    tasks.extend(crate::control::discovery::spawn(&shared, &background));
    if let Some(handle) = shared.metrics.clone() {
        let t = background.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    () = t.cancelled() => return,
                    _ = tick.tick() => handle.run_upkeep(),
                }
            }
        }));
    }
    tracing::info!(%http_addr, pools = shared.pools.all.len(), max_connections, "router started");
    Ok(RunningRouter {
        http_addr,
        grpc_addr,
        shared,
        token,
        tasks,
        started_with: config,
    })
}
