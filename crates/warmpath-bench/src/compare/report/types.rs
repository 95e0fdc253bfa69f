//! What a `compare` run reports per strategy: the numbers every output
//! (JSON, tables, plots) is written from.

use crate::stats::Summary;
use serde::Serialize;
use std::collections::BTreeMap;

/// Index fidelity: the router's predicted cached tokens vs the engine's.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Fidelity {
    /// Requests with both numbers.
    pub samples: usize,
    /// Share of them where prediction == engine, %.
    pub exact_pct: f64,
    /// 100 * (1 - sum |predicted - engine| / sum max(predicted, engine)).
    pub token_agreement_pct: f64,
    /// Requests where the engine had more cached than predicted (a prefill
    /// finished between the query and this request's own).
    pub under_predicted: usize,
    /// Cached tokens the index missed, summed over `under_predicted`.
    pub under_tokens: u64,
    /// Requests where the engine had less cached than predicted (evicted).
    pub over_predicted: usize,
    /// Predicted tokens the engine lacked, summed over `over_predicted`.
    pub over_tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RatePoint {
    /// Offered arrivals per second.
    pub rate: f64,
    /// P90 TTFT at that rate, ms.
    pub ttft_p90_ms: f64,
    pub failures: usize,
    pub ok: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct StrategyReport {
    pub strategy: String,
    /// Offered rate of the main run, req/s.
    pub rate: f64,
    pub requests: usize,
    pub failures: usize,
    /// Cached prompt tokens / prompt tokens (engines' `cached_tokens`).
    pub hit_rate: f64,
    /// The same from the engines' `/metrics`, as a cross-check.
    pub engine_hit_rate: Option<f64>,
    /// The hit rate a perfect router with unlimited cache could reach.
    pub hit_ceiling: Option<f64>,
    /// Offline references (see [`crate::optimum::LEGEND`]).
    pub optimum: Option<crate::optimum::Optimum>,
    /// Time to first token, ms.
    pub ttft_ms: Summary,
    /// End-to-end latency, ms.
    pub e2e_ms: Summary,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    /// Smallest and largest per-instance share, %.
    pub share_min_pct: f64,
    pub share_max_pct: f64,
    /// Requests per backend.
    pub shares: BTreeMap<String, u64>,
    /// Requests per routing decision kind.
    pub decisions: BTreeMap<String, u64>,
    pub fidelity: Option<Fidelity>,
    /// Highest searched rate with P90 TTFT under the SLO, req/s.
    pub goodput_rps: Option<f64>,
    pub rate_search: Vec<RatePoint>,
    /// (second, hit rate of requests completed in it).
    pub hit_over_time: Vec<(f64, f64)>,
    /// TTFT CDF points (ms, fraction).
    pub ttft_cdf: Vec<(f64, f64)>,
}
