//! Prometheus metrics: the recorder and the series (table: docs/operations.md);
//! requests refused before a pool is known count with `pool="-"`.

use axum::http::StatusCode;
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Histogram buckets by series; the others get the exporter's defaults.
const BUCKETS: [(&str, &[f64]); 5] = [
    (
        "warmpath_router_overhead_seconds",
        &[
            1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2,
            0.25,
        ],
    ),
    (
        "warmpath_upstream_first_byte_seconds",
        &[
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ],
    ),
    // A histogram (not a summary) aggregates across router replicas.
    (
        "warmpath_ingest_lag_seconds",
        &[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ],
    ),
    // LLM answers: tens of milliseconds to minutes.
    (
        "warmpath_request_duration_seconds",
        &[
            0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
            600.0, 1800.0,
        ],
    ),
    (
        "warmpath_matched_blocks",
        &[
            0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
        ],
    ),
];

fn build() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in BUCKETS {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.into()), buckets)?;
    }
    let handle = builder.install_recorder()?;
    describe();
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    // One series a line: `describe_KIND "name" (Unit)? "HELP"`.
    macro_rules! describe {
        ($($kind:ident $name:literal $(($unit:ident))? $help:literal;)*) => {
            $($kind!($name, $(metrics::Unit::$unit,)? $help);)*
        };
    }
    describe! {
        describe_gauge "warmpath_build_info" "Always 1; the labels name the running build";
        describe_counter "warmpath_replica_facts_total" "Routing decisions shared with the other router replicas through the agents, by direction (sent; received; dropped: the agent stream's queue was full; unsent: no stream of the chosen backend's agent is up; forged: a relayed fact not signed with the key of this router's agent_secret, dropped; malformed: relayed bytes that are no fact, dropped)";
        describe_gauge "warmpath_replica_sharing_up" "Agent streams of the pool that carry shared decisions now (0: this router decides on its own view only)";
        describe_counter "warmpath_backend_ejections_total" "Times a backend was ejected (failed requests or probes in a row)";
        describe_counter "warmpath_request_bodies_refused_total" "Requests answered 503 because 32 max_body_bytes of request bodies were held";
        describe_counter "warmpath_send_timeouts_total" "Answers whose client read nothing for 3 server.header_timeout_ms: the backend's answer and slot were let go";
        describe_counter "warmpath_panic_routed_total" "Requests routed to ejected backends because every member that could take them was ejected (panic routing)";
        describe_counter "warmpath_ejections_refused_total" "Ejections not made because health.max_ejection_percent of the pool was already out";
        describe_histogram "warmpath_request_duration_seconds" (Seconds) "From a proxied request's head to its answer's last byte (or the client leaving)";
        describe_counter "warmpath_backend_requests_total" "Requests sent to each backend, by how they ended (ok, server_error, connect_error, timeout, failed, cancelled)";
        describe_counter "warmpath_requests_total" "Requests answered, by pool, strategy, routing decision and HTTP status";
        describe_histogram "warmpath_matched_blocks" (Count) "Cached blocks the chosen backend holds of a request (per the index)";
        describe_counter "warmpath_predicted_cached_tokens_total" (Count) "Prompt tokens predicted to be served from the engine's prefix cache";
        describe_histogram "warmpath_upstream_first_byte_seconds" (Seconds) "From sending upstream to the first body byte";
        describe_histogram "warmpath_router_overhead_seconds" (Seconds) "Routing time per phase";
        describe_gauge "warmpath_backend_in_flight" "Requests this router has in flight per backend";
        describe_gauge "warmpath_backend_healthy" "1 when the backend is in rotation and its latest active probe passed, else 0";
        describe_gauge "warmpath_ready" "1 when GET /readyz answers 200: every pool has a probe-verified backend and the router is not draining";
        describe_gauge "warmpath_index_entries" "(block, worker, tier) entries in the pool's cache index";
        describe_gauge "warmpath_index_max_entries" "The pool's index.max_entries: past it, new blocks from agents are refused (warmpath_ingest_refused_blocks_total{reason=\"max_entries\"})";
        describe_gauge "warmpath_index_bytes" (Bytes) "Estimated memory of the pool's cache index: allocated hash-table slots x 25 bytes (8-byte key, 16-byte holder set, 1 control byte); holder sets of 3+ workers take further heap, not counted";
        describe_gauge "warmpath_index_dead_entries" "Entries of cleared workers waiting for compaction (every 30 s, or at once when they outnumber the live ones)";
        describe_counter "warmpath_ingest_refused_blocks_total" "Blocks from agent streams not stored because an index bound was reached, by reason (worker_capacity: reported capacity x 1.25, at most a quarter of index.max_entries; max_entries: the pool's index.max_entries)";
        describe_gauge "warmpath_stale_workers" "Workers whose agent is silent past the deadline";
        describe_gauge "warmpath_index_prefix_closed_workers" "Workers whose agent reports their cached blocks prefix-closed, so index walks skip ahead";
        describe_counter "warmpath_hot_cache_hits_total" "Lookups in the router's hot-path memo caches that saved their work";
        describe_counter "warmpath_hot_cache_misses_total" "Lookups in the router's hot-path memo caches that did the work";
        describe_counter "warmpath_work_offloaded_total" "Big-body requests routed on the bounded work pool (256 KiB and up)";
        describe_counter "warmpath_work_rejected_total" "Big-body requests answered 503 overloaded: no work-pool turn within 10 s";
        describe_counter "warmpath_ingest_messages_total" "Agent stream messages applied to the index, by kind (snapshot_chunk, delta)";
        describe_counter "warmpath_ingest_blocks_total" "Blocks applied to the index from agent streams, by op (snapshot, stored, removed)";
        describe_histogram "warmpath_ingest_lag_seconds" (Seconds) "From an engine observing a cache change to the router applying it";
        describe_counter "warmpath_ingest_throttled_total" "Snapshots, clears and block-size Hellos an agent sent less than 1 s after its worker's previous one, by kind; each waited its turn (nothing is dropped)";
        describe_counter "warmpath_ingest_gaps_total" "Sequence gaps in agent streams (answered with a resend of the snapshot)";
        describe_counter "warmpath_ingest_refused_total" "Agent streams refused, by reason (auth, identity, model, worker_id, removed, block size, epoch, no_hello, streams)";
        describe_counter "warmpath_ingest_pod_token_reviews_total" "Agents' pod tokens reviewed with the Kubernetes API server, by outcome (accepted, refused, unavailable); kept answers are not counted";
        describe_gauge "warmpath_hot_cache_entries" "Entries held by the router's hot-path memo caches";
        describe_gauge "warmpath_connections_open" "Client connections open now";
        describe_counter "warmpath_connections_refused_total" "Client connections refused because server.max_connections were open";
        describe_counter "warmpath_discovery_rounds_total" "Discovery rounds per provider, by result (ok, error); an error keeps the last known backends";
        describe_counter "warmpath_discovery_changes_total" "Discovery rounds whose answer added or drained backends";
        describe_gauge "warmpath_discovery_backends" "Backends in a discovery provider's last applied answer";
        describe_counter "warmpath_pool_membership_changes_total" "Pool membership changes (admin API, reload, discovery), by op (add, drain, remove)";
        describe_counter "warmpath_response_affinity_total" "Requests naming a stored /v1/responses response, by how its engine was found (known, located, unknown, gone)";
    }
    metrics::gauge!("warmpath_build_info", "binary" => "warmpath-router", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// A phase of `warmpath_router_overhead_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Reading the body's JSON, resolving the pool and the tenant.
    Parse,
    /// Rendering and tokenizing.
    Tokenize,
    Hash,
    /// The index match.
    Lookup,
    Pick,
}

impl Phase {
    /// `phase` labels, by discriminant.
    const LABELS: [&'static str; 5] = ["parse", "tokenize", "hash", "lookup", "pick"];
}

/// A pool's per-request series, registered once (a lookup costs more than an update).
#[derive(Clone, Debug)]
pub(crate) struct PoolMetrics {
    pub matched_blocks: Histogram,
    pub predicted_tokens: Counter,
    pub first_byte: Histogram,
    pub duration: Histogram,
    overhead: [Histogram; 5],
    model: Arc<str>,
    /// `warmpath_requests_total`, looked up once per label set.
    requests: Arc<RwLock<HashMap<RequestLabels, Counter>>>,
}

type RequestLabels = (&'static str, &'static str, u16);

impl PoolMetrics {
    pub(crate) fn new(model: &str) -> Self {
        PoolMetrics {
            matched_blocks: metrics::histogram!("warmpath_matched_blocks", "pool" => model.to_owned()),
            predicted_tokens: metrics::counter!(
                "warmpath_predicted_cached_tokens_total", "pool" => model.to_owned()
            ),
            first_byte: metrics::histogram!(
                "warmpath_upstream_first_byte_seconds", "pool" => model.to_owned()
            ),
            duration: request_duration(model),
            overhead: Phase::LABELS
                .map(|p| metrics::histogram!("warmpath_router_overhead_seconds", "phase" => p)),
            model: model.into(),
            requests: Arc::default(),
        }
    }

    /// Counts a finished routing attempt in `warmpath_requests_total`.
    pub(crate) fn count(&self, strategy: &'static str, decision: &'static str, status: StatusCode) {
        let key = (strategy, decision, status.as_u16());
        if let Some(c) = self.requests.read().get(&key) {
            c.increment(1);
            return;
        }
        let c = requests_counter(&self.model, strategy, decision, status);
        c.increment(1);
        self.requests.write().insert(key, c);
    }

    /// Records `took` in `warmpath_router_overhead_seconds{phase}`.
    pub(crate) fn overhead(&self, phase: Phase, took: std::time::Duration) {
        self.overhead[phase as usize].record(took.as_secs_f64());
    }
}

/// `warmpath_requests_total{pool, strategy, decision, status}`.
pub(crate) fn requests_counter(
    pool: &str,
    strategy: &'static str,
    decision: &'static str,
    status: StatusCode,
) -> Counter {
    metrics::counter!("warmpath_requests_total",
        "pool" => pool.to_owned(), "strategy" => strategy,
        "decision" => decision, "status" => status.as_u16().to_string())
}

/// `warmpath_request_duration_seconds{pool}`.
pub(crate) fn request_duration(pool: &str) -> Histogram {
    metrics::histogram!("warmpath_request_duration_seconds", "pool" => pool.to_owned())
}

/// How a request sent to a backend ended (`warmpath_backend_requests_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Answered below 500 and streamed to its end.
    Ok,
    /// Answered 500 or above.
    ServerError,
    /// Connecting failed (the request went to another backend).
    ConnectError,
    /// No answer in time, or a body silent for the stream idle timeout.
    Timeout,
    /// The exchange broke after the request was sent.
    Failed,
    /// The client left (or the shutdown deadline passed) first.
    Cancelled,
}

impl Outcome {
    /// `outcome` labels, by discriminant.
    pub(crate) const LABELS: [&'static str; 6] = [
        "ok",
        "server_error",
        "connect_error",
        "timeout",
        "failed",
        "cancelled",
    ];
}

/// Counts one `warmpath_response_affinity_total{pool, outcome}`.
pub(crate) fn response_affinity(model: &str, outcome: &'static str) {
    metrics::counter!("warmpath_response_affinity_total", "pool" => model.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// Counts one `warmpath_pool_membership_changes_total{pool, op}`.
pub(crate) fn membership_change(model: &str, op: &'static str) {
    metrics::counter!("warmpath_pool_membership_changes_total", "pool" => model.to_owned(), "op" => op)
        .increment(1);
}

/// Installs the Prometheus recorder on first call; `None` when another was first.
pub(crate) fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| match build() {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "metrics recorder not installed; /metrics disabled");
                None
            }
        })
        .clone()
}
