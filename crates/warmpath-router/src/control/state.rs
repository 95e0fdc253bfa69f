//! The state every handler shares.

use crate::config::RouterConfig;
use crate::http::error::ApiError;
use crate::http::incoming::{read_body, BodyBudget, Held};
use crate::http::work::WorkPool;
use crate::ingest::Agents;
use crate::routing::loads::AgentLoads;
use crate::routing::pool::Pools;
use crate::routing::share::Replicas;
use crate::routing::upstream::Upstream;
use axum::body::Body;
use axum::http::HeaderMap;
use bytes::Bytes;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) struct Shared {
    pub pools: Arc<Pools>,
    /// The upstream side: client, credentials, deadlines, ejection rules.
    pub upstream: Arc<Upstream>,
    pub config: RouterConfig,
    /// The `Host` names answered, when the listener is loopback.
    pub hosts: Option<Vec<String>>,
    /// Prometheus renderer (None when another recorder was installed first).
    pub metrics: Option<PrometheusHandle>,
    /// What agents report, when the gRPC ingest runs.
    pub agents: Option<Arc<Agents>>,
    /// Start time, for uptime and event ages.
    pub started: Instant,
    pub work: WorkPool,
    /// The request bodies held at once (32 `max_body_bytes`).
    pub bodies: Arc<BodyBudget>,
    /// Set at the start of a shutdown: not ready, still serving.
    draining: AtomicBool,
    /// Cancelled when the shutdown deadline passes.
    pub halt: CancellationToken,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("pools", &self.pools)
            .field("listen", &self.config.listen)
            .field("ingest", &self.agents.is_some())
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// A request's body, read under `max_body_bytes` and the body timeout.
    pub(crate) async fn body(
        &self,
        body: Body,
        headers: &HeaderMap,
        held: &mut Held,
    ) -> Result<Bytes, ApiError> {
        let deadline = self.config.server.body_timeout();
        read_body(body, headers, self.config.max_body_bytes, deadline, held).await
    }

    /// Shared state for a validated config and built pools.
    pub(crate) fn new(
        config: &RouterConfig,
        pools: Arc<Pools>,
        metrics: Option<PrometheusHandle>,
        agents: Option<Arc<Agents>>,
    ) -> Self {
        let halt = CancellationToken::new();
        Shared {
            pools,
            upstream: Arc::new(Upstream::new(config, halt.clone())),
            config: config.clone(),
            hosts: crate::config::loopback_hosts(&config.listen, &config.server.allowed_hosts),
            metrics,
            agents,
            started: Instant::now(),
            work: WorkPool::new(),
            bodies: BodyBudget::new(config.max_body_bytes_in_flight()),
            draining: AtomicBool::new(false),
            halt,
        }
    }

    /// Whether a shutdown has begun (readiness reads it: false from then on).
    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The other router replicas, while this one shares its decisions.
    pub(crate) fn replicas(&self) -> Option<Replicas<'_>> {
        let peers = &self.agents.as_deref()?.peers;
        peers.enabled().then_some(Replicas {
            sink: peers,
            source: &**peers,
        })
    }

    /// Agent-reported loads, when the ingest runs.
    pub(crate) fn agents(&self) -> Option<&dyn AgentLoads> {
        self.agents.as_deref().map(|a| a as &dyn AgentLoads)
    }
}
