//! Routing policies behind one trait.
//!
//! Like pingora's `BackendSelection`, a policy has two methods: it is
//! **built** from a snapshot of a pool's backends ([`PolicyBackend`], rebuilt
//! when membership changes) and then **picks** for each request from a
//! [`RouteInput`] and the backends' current [`Loads`] (same order as the
//! snapshot). Policies hold no per-request state, so one instance is shared
//! by every routing thread. A pick under [`Mode::Preview`] answers what a
//! commit would choose without recording anything (`kv_aware`, the one
//! policy with memory, runs the same decision on a scratch copy of its
//! state). What only a policy with memory does (home lookups, other
//! replicas' decisions, carrying what it learned over a membership change)
//! is the optional [`Learns`] side of a [`Built`] policy: callers ask
//! whether it is there, never which strategy it is.
//!
//! | strategy | picks | decision kinds |
//! |---|---|---|
//! | `random` | uniformly among eligible backends | `random` |
//! | `least_outstanding` | fewest in flight, ties broken at random | `least_outstanding` |
//! | `prefix_aware` | consistent hashing with bounded loads on the prefix key | `prefix_hash`, `spill`, `least_outstanding` |
//! | `kv_aware` | one cost formula over the actual cached-block match, queued prefill, load, cache writes and (capacity known) what a write evicts; a prefix too hot for one backend is copied (see [`kv`]) | `kv_match`, `spill`, `prefix_hash`, `cold`, `replicate`, `least_outstanding` |

mod candidates;
mod carry;
mod home;
mod kv;
mod least;
mod place;
mod random;
mod rebalance;
mod remote;
mod resident;
mod ring;
mod tuning;

pub use kv::KvAware;
pub use least::LeastOutstanding;
pub use random::Random;
pub use remote::{HomeView, RemoteDecision};
pub use ring::{PrefixAware, Ring};
pub use tuning::KvConfig;

use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use thiserror::Error;
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

/// Why a backend was chosen; sent as `x-warmpath-decision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// The backend holds a useful cached prefix of the request.
    KvMatch,
    /// The first backend of the prefix's place on the ring.
    PrefixHash,
    /// The preferred backend was at its limit; the next one with capacity.
    Spill,
    /// A prefix no backend holds, placed by the policy's own rule (kv_aware's
    /// cold placement) rather than by the ring: says nothing about load.
    Cold,
    /// A deliberate second (third ...) warm copy of a prefix too hot for
    /// one backend: kv_aware sent this request to start it (see [`kv`]).
    Replicate,
    /// Fewest in flight (the strategy, or every backend was at its limit).
    LeastOutstanding,
    /// Uniform random.
    Random,
    /// Not a policy's pick: a `/v1/responses` follow-up sent to the engine
    /// that stored the response it continues (the router's response
    /// affinity), which only that engine holds.
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

/// Errors of policy configuration and picking.
#[derive(Debug, Error, PartialEq)]
pub enum PolicyError {
    /// No eligible backend (all unhealthy, or none serves the model/adapter).
    /// Retryable once a backend recovers.
    #[error("no healthy backend is available")]
    NoBackend,
    /// A strategy name that does not exist.
    #[error(
        "unknown strategy {0:?}; expected random, least_outstanding, prefix_aware or kv_aware"
    )]
    UnknownStrategy(String),
    /// A configuration value out of range.
    #[error("invalid policy setting {name}: {reason}")]
    Invalid {
        /// The setting.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting that no longer exists (refused rather than ignored).
    #[error("policy setting {name} was removed; {instead}")]
    Removed {
        /// The setting.
        name: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
}

/// One backend of the snapshot a policy is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyBackend {
    /// Stable id (the worker id); the ring is placed by it, not by position.
    pub id: String,
    /// Its slot in the pool's cache index.
    pub slot: WorkerSlot,
    /// Its prefix cache's capacity in blocks, when known (the agent's
    /// Hello, or the simulator's own setting): `kv_aware` then models what
    /// it holds and charges a placement for the hotter prefixes it evicts
    /// (see [`kv`]). `None`: never modelled, as before.
    pub capacity_blocks: Option<u64>,
}

/// Load reported by the engine through its agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineLoad {
    /// Requests running.
    pub running: u32,
    /// Requests waiting.
    pub waiting: u32,
    /// KV cache usage, 0..=1.
    pub kv_usage: f32,
    /// Blocks the engine's cache holds, when it reports them: kv_aware then
    /// models that backend's cache (`resident`).
    pub capacity_blocks: Option<u64>,
    /// The agent's view misses blocks the engine holds (it started beside a
    /// warm engine): its missing blocks are unknown, not absent (`kv`).
    #[serde(default)]
    pub partial: bool,
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

/// Whether a pick is recorded ([`Policy::pick`] routes the request) or
/// only computed (what `POST /cache-index/query` shows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Records what the policy learns of the decision (`kv_aware`:
    /// placement, pressure, popularity, the modelled caches).
    #[default]
    Commit,
    /// Changes nothing that a later pick reads: no later decision differs
    /// for it. Only `rng` is drawn from: pass a deterministic one for a
    /// repeatable answer.
    Preview,
}

/// The backends' current loads, in snapshot order and as long as it.
#[derive(Clone, Copy, Debug)]
pub struct Loads<'a> {
    /// Every backend's load.
    pub all: &'a [BackendLoad],
    /// When known, every position whose load may differ from the loads of
    /// this policy's previous pick (a superset is fine, a position twice
    /// too). The same decision either way; `kv_aware` then refiles only
    /// those positions instead of comparing every load, so a caller that
    /// tracks its load changes (the router's load board, the scale model)
    /// saves an O(n) pass per decision. The others ignore it.
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
    /// Why.
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
        if !(1..=1024).contains(&self.concurrency_threshold) {
            return Err(PolicyError::Invalid {
                name: "concurrency_threshold",
                reason: format!("{} is outside 1..=1024", self.concurrency_threshold),
            });
        }
        if !(self.load_factor > 1.0 && self.load_factor.is_finite()) {
            return Err(PolicyError::Invalid {
                name: "load_factor",
                reason: format!("{} must be a finite number above 1", self.load_factor),
            });
        }
        if !(1..=4096).contains(&self.vnodes) {
            return Err(PolicyError::Invalid {
                name: "vnodes",
                reason: format!("{} is outside 1..=4096", self.vnodes),
            });
        }
        self.kv.validate()
    }
}

/// A routing policy: built from a snapshot, picks per request.
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

/// What only a policy with memory (`kv_aware`) does beyond picking: the
/// stateless policies do not implement it, and a caller asks
/// [`Built::learns`] rather than the strategy.
pub trait Learns: Send + Sync + fmt::Debug {
    /// Where `prefix_key` lives after the decisions so far (`None` when it
    /// keeps no home for it): what a router shares with its replicas
    /// beside each pick.
    fn home_of(&self, prefix_key: u64) -> Option<HomeView>;

    /// Records a pick another router replica made, as it records its own
    /// (see `remote`).
    fn observe_remote(&self, decision: &RemoteDecision);

    /// The same policy over a new membership `snapshot` (one added,
    /// removed ...), carrying what it learned per worker over by worker id
    /// for the workers that remain: a removed worker's goes, a new one
    /// starts empty (see `carry`).
    fn carried(
        &self,
        snapshot: &[PolicyBackend],
        config: &PolicyConfig,
    ) -> Result<Built, PolicyError>;
}

/// A built policy, and its [`Learns`] side when it has one (the same
/// object).
#[derive(Clone, Debug)]
pub struct Built {
    /// Which strategy it is: the caller keeps it, the policy is not asked.
    pub strategy: Strategy,
    /// Picks.
    pub policy: Arc<dyn Policy>,
    /// What only a policy with memory does; `None` for the stateless ones.
    pub learns: Option<Arc<dyn Learns>>,
}

impl Built {
    /// A stateless policy.
    fn stateless(strategy: Strategy, policy: impl Policy + 'static) -> Self {
        Built {
            strategy,
            policy: Arc::new(policy),
            learns: None,
        }
    }

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

/// Builds the policy for `strategy` over `snapshot`. With `previous` of
/// the same strategy that learns (a membership change), what it learned of
/// the workers that remain carries over ([`Learns::carried`]); otherwise it
/// starts afresh.
pub fn build_policy(
    strategy: Strategy,
    config: &PolicyConfig,
    snapshot: &[PolicyBackend],
    previous: Option<&Built>,
) -> Result<Built, PolicyError> {
    config.validate()?;
    let carry = previous
        .filter(|p| p.strategy == strategy)
        .and_then(|p| p.learns.as_ref());
    if let Some(learns) = carry {
        return learns.carried(snapshot, config);
    }
    Ok(match strategy {
        Strategy::Random => Built::stateless(strategy, Random::build(snapshot, config)?),
        Strategy::LeastOutstanding => {
            Built::stateless(strategy, LeastOutstanding::build(snapshot, config)?)
        }
        Strategy::PrefixAware => Built::stateless(strategy, PrefixAware::build(snapshot, config)?),
        Strategy::KvAware => Built::learning(strategy, KvAware::build(snapshot, config)?),
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
pub(crate) mod test_util {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    pub(crate) fn rng() -> SmallRng {
        SmallRng::seed_from_u64(7)
    }

    pub(crate) fn backends(n: usize) -> Vec<PolicyBackend> {
        (0..n)
            .map(|i| PolicyBackend {
                id: format!("b{i}"),
                slot: i as WorkerSlot,
                capacity_blocks: None,
            })
            .collect()
    }

    /// A match of a `chain`-block request; `list` is (slot, blocks, fresh).
    pub(crate) fn matches(list: &[(u16, u32, bool)], chain: u32) -> crate::index::MatchResult {
        crate::index::MatchResult {
            workers: list
                .iter()
                .map(|&(slot, blocks, fresh)| crate::index::WorkerMatch {
                    slot,
                    blocks,
                    gpu_blocks: blocks,
                    fresh,
                })
                .collect(),
            chain_len: chain,
        }
    }

    /// `input` as a preview (what `route::preview` asks).
    pub(crate) fn previewing<'a>(input: &RouteInput<'a>) -> RouteInput<'a> {
        RouteInput {
            mode: Mode::Preview,
            ..*input
        }
    }

    pub(crate) fn idle(n: usize) -> Vec<BackendLoad> {
        vec![
            BackendLoad {
                eligible: true,
                ..Default::default()
            };
            n
        ]
    }

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
        assert!(bad.validate().is_err());
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
                partial: false,
            }),
            ..Default::default()
        };
        assert_eq!(l.effective_in_flight(), 7);
    }
}
