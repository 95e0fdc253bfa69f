//! What a routing policy is given and gives back: strategies, loads, decisions,
//! config, the [`Policy`] trait and the [`Learns`] side only `kv_aware` has. The
//! policies themselves are in [`crate::policy`].

use crate::error::PolicyError;
use crate::policy::kv::tuning::KvConfig;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use warmpath_index::{MatchResult, WorkerSlot};

/// The four strategies, by their user-facing names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Uniform random.
    Random,
    /// Fewest requests in flight.
    LeastOutstanding,
    /// Consistent hash of the prefix (CHWBL).
    PrefixAware,
    /// Longest actually cached block match, weighed against load.
    KvAware,
}

impl Strategy {
    /// All strategies, in the order reports list them.
    pub const ALL: [Strategy; 4] = [
        Strategy::Random,
        Strategy::LeastOutstanding,
        Strategy::PrefixAware,
        Strategy::KvAware,
    ];

    /// The user-facing name.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Random => "random",
            Strategy::LeastOutstanding => "least_outstanding",
            Strategy::PrefixAware => "prefix_aware",
            Strategy::KvAware => "kv_aware",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "random" => Ok(Strategy::Random),
            "least_outstanding" | "least_outstanding_requests" => Ok(Strategy::LeastOutstanding),
            "prefix_aware" => Ok(Strategy::PrefixAware),
            "kv_aware" => Ok(Strategy::KvAware),
            _ => Err(PolicyError::UnknownStrategy(s.to_owned())),
        }
    }
}

/// Why a backend was chosen; sent as `x-warmpath-decision` (docs/operations.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// The backend holds a useful cached prefix of the request.
    KvMatch,
    /// The first backend of the prefix's place on the ring.
    PrefixHash,
    /// The preferred backend was at its limit; the next one with capacity.
    Spill,
    /// A prefix no backend holds, placed by kv_aware's cold placement.
    Cold,
    /// A request that starts one more copy of a prefix too hot for its holders.
    Replicate,
    /// Fewest in flight (the strategy, or every backend was at its limit).
    LeastOutstanding,
    /// Uniform random.
    Random,
    /// Not a policy's pick: a `/v1/responses` follow-up sent to the engine that
    /// stored the response it continues.
    Affinity,
}

impl DecisionKind {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::KvMatch => "kv_match",
            DecisionKind::PrefixHash => "prefix_hash",
            DecisionKind::Spill => "spill",
            DecisionKind::Cold => "cold",
            DecisionKind::Replicate => "replicate",
            DecisionKind::LeastOutstanding => "least_outstanding",
            DecisionKind::Random => "random",
            DecisionKind::Affinity => "affinity",
        }
    }
}

impl fmt::Display for DecisionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One backend of the snapshot a policy is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyBackend {
    /// Stable id (the worker id); the ring is placed by it, not by position.
    pub id: String,
    /// Its slot in the pool's cache index.
    pub slot: WorkerSlot,
    /// Its prefix cache's capacity in blocks, when known: `kv_aware` then models
    /// what it holds and charges a placement for what it evicts.
    pub capacity_blocks: Option<u64>,
}

/// Load reported by the engine through its agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineLoad {
    pub running: u32,
    pub waiting: u32,
    /// KV cache usage, 0..=1.
    pub kv_usage: f32,
    /// Blocks the engine's cache holds, when it reports them.
    pub capacity_blocks: Option<u64>,
}

/// The current load of one backend, in snapshot order.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BackendLoad {
    /// Healthy and serving the requested model/adapter.
    pub eligible: bool,
    /// Requests this router has in flight there.
    pub in_flight: u32,
    /// Prefill blocks this router predicts are still to compute there
    /// (uncached blocks of requests that have not produced a first byte).
    pub pending_prefill_blocks: u64,
    /// What the engine itself reports, when an agent publishes it.
    pub engine: Option<EngineLoad>,
}

impl BackendLoad {
    /// In flight as best known: the router's own count, or the engine's
    /// running + waiting when that is higher (other router replicas).
    pub fn effective_in_flight(&self) -> u32 {
        let engine = self
            .engine
            .map_or(0, |e| e.running.saturating_add(e.waiting));
        self.in_flight.max(engine)
    }
}

/// What a policy knows of one request.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteInput<'a> {
    /// The PREFIX_AWARE key (prefix hash mixed with tenant and model).
    pub prefix_key: u64,
    /// Full blocks in the request's chain (0 when not tokenized).
    pub chain_blocks: u32,
    /// The index's per-worker match of the chain, for `kv_aware`.
    pub matches: Option<&'a MatchResult>,
    /// Whether the pick is recorded or only previewed.
    pub mode: Mode,
}

/// Whether a pick is recorded ([`Policy::pick`] routes the request) or only
/// computed (what `POST /cache-index/query` shows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Records what the policy learns of the decision.
    #[default]
    Commit,
    /// Changes nothing that a later pick reads. Only `rng` is drawn from: pass a
    /// deterministic one for a repeatable answer.
    Preview,
}

/// The backends' current loads, in snapshot order and as long as it.
#[derive(Clone, Copy, Debug)]
pub struct Loads<'a> {
    pub all: &'a [BackendLoad],
    /// When known, every position whose load may differ from the loads of this
    /// policy's previous pick (a superset is fine): the same decision either
    /// way, but `kv_aware` then refiles only those instead of an O(n) pass.
    pub changed: Option<&'a [usize]>,
}

impl<'a> Loads<'a> {
    /// Every load, changes not tracked.
    pub fn new(all: &'a [BackendLoad]) -> Self {
        Loads { all, changed: None }
    }
}

/// A policy's choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Position in the snapshot / loads.
    pub backend: usize,
    pub kind: DecisionKind,
    /// Blocks the chosen backend holds of the request (0 when unknown).
    pub matched_blocks: u32,
}

/// Knobs shared by the policies; validated once by [`PolicyConfig::validate`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// In flight at which a backend counts as full (1..=1024).
    pub concurrency_threshold: u32,
    /// CHWBL bound: no backend takes more than `load_factor` x the mean load
    /// (+1). Must be > 1.
    pub load_factor: f64,
    /// Virtual nodes per backend on the ring (1..=4096).
    pub vnodes: u32,
    /// `kv_aware` knobs.
    pub kv: KvConfig,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            concurrency_threshold: 64,
            load_factor: 1.25,
            vnodes: 160,
            kv: KvConfig::default(),
        }
    }
}

impl PolicyConfig {
    /// Checks every range; the one place these are validated.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let invalid = |name, value: &dyn fmt::Display, rule| {
            let reason = format!("{value} {rule}");
            Err(PolicyError::Invalid { name, reason })
        };
        let (threshold, factor) = (self.concurrency_threshold, self.load_factor);
        if !(1..=1024).contains(&threshold) {
            return invalid("concurrency_threshold", &threshold, "is outside 1..=1024");
        }
        if !(factor > 1.0 && factor.is_finite()) {
            return invalid("load_factor", &factor, "must be a finite number above 1");
        }
        if !(1..=4096).contains(&self.vnodes) {
            return invalid("vnodes", &self.vnodes, "is outside 1..=4096");
        }
        self.kv.validate()
    }
}

/// A routing policy: built from a snapshot, picks per request. It holds no
/// per-request state, so one instance serves every routing thread.
pub trait Policy: Send + Sync + fmt::Debug {
    /// The policy over the membership `snapshot`, with `config` already
    /// validated ([`build_policy`] validates it).
    fn build(snapshot: &[PolicyBackend], config: &PolicyConfig) -> Result<Self, PolicyError>
    where
        Self: Sized;

    /// Picks a backend for `request` (under [`Mode::Preview`]: the decision
    /// a commit would make now with the same `rng`, recording nothing).
    fn pick(
        &self,
        request: &RouteInput<'_>,
        loads: &Loads<'_>,
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError>;
}

/// What only a policy with memory (`kv_aware`) does beyond picking; a caller
/// asks [`Built::learns`] rather than the strategy.
pub trait Learns: Send + Sync + fmt::Debug {
    /// Where `prefix_key` lives after the decisions so far (`None` when it keeps
    /// no home for it): what a router shares with its replicas beside each pick.
    fn home_of(&self, prefix_key: u64) -> Option<HomeView>;

    /// Records a pick another router replica made, as it records its own.
    fn observe_remote(&self, decision: &RemoteDecision);

    /// The same policy over a new membership `snapshot`, carrying what it learned
    /// per worker over by worker id: a removed worker's goes, a new one starts empty.
    fn carried(
        &self,
        snapshot: &[PolicyBackend],
        config: &PolicyConfig,
    ) -> Result<Built, PolicyError>;
}

/// Where a prefix lives after a decision, by position in the policy's snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HomeView {
    pub backend: usize,
    /// Its deliberate copies besides the home.
    pub copies: Vec<usize>,
}

/// A pick another replica made, by positions in this policy's snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteDecision {
    pub prefix_key: u64,
    pub backend: usize,
    pub chain_blocks: u32,
    /// Blocks the backend must prefill (the sender's prediction).
    pub prefill_blocks: u32,
    /// The prefix's home after the decision, when the sender keeps homes.
    pub home: Option<HomeView>,
}

/// A built policy, and its [`Learns`] side when it has one (the same object).
#[derive(Clone, Debug)]
pub struct Built {
    /// Which strategy it is: the caller keeps it, the policy is not asked.
    pub strategy: Strategy,
    pub policy: Arc<dyn Policy>,
    /// `None` for the stateless policies.
    pub learns: Option<Arc<dyn Learns>>,
}

impl Built {
    /// A policy that learns: both sides are `policy`.
    pub(crate) fn learning(strategy: Strategy, policy: impl Policy + Learns + 'static) -> Self {
        let policy = Arc::new(policy);
        Built {
            strategy,
            policy: policy.clone(),
            learns: Some(policy),
        }
    }
}

/// A decision with no match count, or `NoBackend` when there is no `backend`.
pub(crate) fn decision(
    backend: Option<usize>,
    kind: DecisionKind,
) -> Result<Decision, PolicyError> {
    Ok(Decision {
        backend: backend.ok_or(PolicyError::NoBackend)?,
        kind,
        matched_blocks: 0,
    })
}

/// Uniform choice among the indices where `keep` holds, or `None`.
pub(crate) fn choose_uniform(
    n: usize,
    rng: &mut dyn RngCore,
    keep: impl Fn(usize) -> bool,
) -> Option<usize> {
    // Reservoir sampling: one pass, no allocation.
    let mut seen = 0u32;
    let mut chosen = None;
    for i in (0..n).filter(|&i| keep(i)) {
        seen += 1;
        if rng.next_u32().is_multiple_of(seen) {
            chosen = Some(i);
        }
    }
    chosen
}

/// The eligible backend with the fewest in flight, ties broken uniformly.
pub(crate) fn least_loaded(loads: &[BackendLoad], rng: &mut dyn RngCore) -> Option<usize> {
    let min = loads
        .iter()
        .filter(|l| l.eligible)
        .map(BackendLoad::effective_in_flight)
        .min()?;
    choose_uniform(loads.len(), rng, |i| {
        loads[i].eligible && loads[i].effective_in_flight() == min
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.as_str().parse::<Strategy>().unwrap(), s);
        }
        assert!("fastest".parse::<Strategy>().is_err());
    }

    #[test]
    fn config_validation() {
        assert!(PolicyConfig::default().validate().is_ok());
        let bad = PolicyConfig {
            concurrency_threshold: 0,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        let bad = PolicyConfig {
            concurrency_threshold: 1025,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        let bad = PolicyConfig {
            load_factor: 1.0,
            ..Default::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "invalid policy setting load_factor: 1 must be a finite number above 1"
        );
        let bad = PolicyConfig {
            vnodes: 0,
            ..Default::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "invalid policy setting vnodes: 0 is outside 1..=4096"
        );
    }

    #[test]
    fn effective_in_flight_takes_the_engine_view() {
        let l = BackendLoad {
            eligible: true,
            in_flight: 2,
            engine: Some(EngineLoad {
                running: 3,
                waiting: 4,
                kv_usage: 0.5,
                capacity_blocks: None,
            }),
            ..Default::default()
        };
        assert_eq!(l.effective_in_flight(), 7);
    }
}
