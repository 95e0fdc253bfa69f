//! Routing one request: [`plan`] does what does not depend on load (what
//! `POST /cache-index/query` shows), [`pick`] asks the policy with live loads.

use crate::config::Isolation;
use crate::control::metrics::Phase;
use crate::http::clock::monotonic_ms;
use crate::http::error::ApiError;
use crate::routing::loads::{AgentLoads, Board};
use crate::routing::pool::{PolicyState, Pool, Target};
use crate::routing::share::DecisionSource;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;
use warmpath_core::policy::{LeastOutstanding, Mode};
use warmpath_core::prefix::Extracted;
use warmpath_core::request::FirstPrompt;
use warmpath_core::tokenize::TokenizeError;
use warmpath_core::{
    BackendLoad, BlockHash, ChainHasher, Decision, DecisionKind, HashSeed, Loads, MatchResult,
    PolicyError, PrefixKey, Request, RequestBody, RouteInput, Strategy, TenantId,
};

/// What routing knows of a request before looking at load.
#[derive(Debug)]
pub(crate) struct Plan {
    pub target: Target,
    pub tenant: Option<TenantId>,
    /// The request's block chain (empty when not tokenized).
    pub hashes: Vec<BlockHash>,
    /// Per-worker match of the chain (when hashed).
    pub matches: Option<MatchResult>,
    pub prefix_key: PrefixKey,
    pub policy: Arc<PolicyState>,
    /// The prompt's first characters, only for a pool with `show_prompts`.
    pub preview: Option<String>,
    /// The worker that stored the `/v1/responses` response it continues.
    pub pinned: Option<String>,
    /// Learn the response id its answer carries (`POST /v1/responses`).
    pub learns_response: bool,
    /// The stored response it continues (`previous_response_id`).
    pub follows: Option<String>,
}

impl Plan {
    /// The one place a plan is made: nothing hashed, matched or pinned yet.
    fn new(
        target: Target,
        tenant: Option<TenantId>,
        prefix_key: PrefixKey,
        policy: Arc<PolicyState>,
    ) -> Plan {
        Plan {
            target,
            tenant,
            hashes: Vec::new(),
            matches: None,
            prefix_key,
            policy,
            preview: None,
            pinned: None,
            learns_response: false,
            follows: None,
        }
    }
}

/// Characters of a prompt kept as its chain's preview (`show_prompts`).
pub(crate) const PREVIEW_CHARS: usize = 160;

/// When to compute token ids and block hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hashing {
    /// Only when the policy is `kv_aware` or the prompt is already token ids.
    WhenUseful,
    /// Whenever possible (inspection).
    Always,
}

fn observe(pool: &Pool, phase: Phase, since: Instant) -> Instant {
    let now = Instant::now();
    pool.metrics.overhead(phase, now.duration_since(since));
    now
}

/// Plans a chat or completion request.
pub(crate) fn plan(
    target: Target,
    tenant: Option<TenantId>,
    req: &Request<'_>,
    hashing: Hashing,
) -> Result<Plan, ApiError> {
    let pool = Arc::clone(&target.pool);
    let policy = pool.policy();
    let given = match &req.body {
        RequestBody::Completion(p) => match p.first() {
            FirstPrompt::Ids(ids) => Some(ids),
            FirstPrompt::Text(_) => None,
        },
        RequestBody::Chat(_) => None,
    };
    let want =
        given.is_some() || hashing == Hashing::Always || policy.strategy == Strategy::KvAware;
    let mut hashes = Vec::new();
    let mut matches = None;
    if want {
        let t = Instant::now();
        // `route_only` tenants share the engine cache: their blocks hash unsalted.
        let salt = match pool.tenants.isolation {
            Isolation::Engine => tenant.as_ref().map_or("", TenantId::as_str),
            Isolation::RouteOnly => "",
        };
        let seed = HashSeed::new(&pool.model, target.adapter.as_deref().unwrap_or(""), salt);
        let cap = pool.prompt_cap();
        let ids = match (given, &pool.tokenizer) {
            (Some(ids), _) => {
                if let Some(cap) = cap.filter(|&c| ids.len() > c) {
                    return Err(TokenizeError::PromptTooLong {
                        cap,
                        seen: ids.len(),
                        complete: true,
                    }
                    .into());
                }
                Some((Cow::Borrowed(ids), t))
            }
            (None, Some(tok)) => {
                let ids = tok.encode_request_capped(req, cap)?;
                Some((Cow::Owned(ids), observe(&pool, Phase::Tokenize, t)))
            }
            (None, None) => None,
        };
        if let Some((ids, t)) = ids {
            ChainHasher::new(seed, pool.block_size).extend(&ids, &mut hashes);
            let t = observe(&pool, Phase::Hash, t);
            matches = Some(pool.index.longest_match(&hashes));
            observe(&pool, Phase::Lookup, t);
        }
    }
    // Only prefix_aware and kv_aware read the key (and inspection shows it).
    let keyed = hashing == Hashing::Always
        || matches!(policy.strategy, Strategy::PrefixAware | Strategy::KvAware);
    let prefix_key = if keyed {
        pool.prefix
            .key_for_request(&req.model, tenant.as_ref(), req)
    } else {
        PrefixKey(0)
    };
    let preview = pool
        .show_prompts
        .then(|| prompt_preview(&pool, req))
        .flatten();
    Ok(Plan {
        hashes,
        matches,
        preview,
        ..Plan::new(target, tenant, prefix_key, policy)
    })
}

/// The first [`PREVIEW_CHARS`] of what the prefix key reads; `None` for token ids.
fn prompt_preview(pool: &Pool, req: &Request<'_>) -> Option<String> {
    match pool.prefix.extract(req) {
        Extracted::Text(t) => Some(t.chars().take(PREVIEW_CHARS).collect()),
        Extracted::Ids(_) => None,
    }
}

/// Plans a native `/invocations` request: prefix key of the raw body, no hashes.
pub(crate) fn plan_raw(target: Target, tenant: Option<TenantId>, model: &str, body: &[u8]) -> Plan {
    let policy = target.pool.policy();
    let prefix_key = target
        .pool
        .prefix
        .key_for_body(model, tenant.as_ref(), body);
    Plan::new(target, tenant, prefix_key, policy)
}

/// Plans a request without a prompt (`/detokenize`): least outstanding.
pub(crate) fn plan_least(target: Target, tenant: Option<TenantId>) -> Plan {
    let current = target.pool.policy();
    let policy = Arc::new(PolicyState {
        strategy: Strategy::LeastOutstanding,
        config: current.config.clone(),
        policy: Arc::new(LeastOutstanding),
        learns: None,
        backends: Arc::clone(&current.backends),
        board: Board::default(),
    });
    Plan::new(target, tenant, PrefixKey(0), policy)
}

/// The live loads of `plan`'s backends, those that cannot take it ineligible.
pub(crate) fn loads(
    plan: &Plan,
    agents: Option<&dyn AgentLoads>,
    replicas: Option<&dyn DecisionSource>,
) -> Vec<BackendLoad> {
    with_adjusted(plan, &[], agents, replicas, false, <[BackendLoad]>::to_vec)
}

/// Runs `f` with the loads of `plan`'s snapshot ([`Board::with`]).
fn read<R>(
    plan: &Plan,
    agents: Option<&dyn AgentLoads>,
    tracked: bool,
    f: impl FnOnce(&[BackendLoad], Option<&[usize]>) -> R,
) -> R {
    let (p, now_ms) = (&plan.policy, monotonic_ms());
    let model = &plan.target.pool.model;
    p.board.with(model, &p.backends, agents, now_ms, tracked, f)
}

/// Runs `f` with this request's own loads: eligible as [`eligible`] says (in
/// `panic`, [`could_take`]), other replicas' requests added. A learning policy
/// is asked under the board's lock, so no tracked pick slips in between.
fn with_adjusted<R>(
    plan: &Plan,
    excluded: &[usize],
    agents: Option<&dyn AgentLoads>,
    replicas: Option<&dyn DecisionSource>,
    panic: bool,
    f: impl FnOnce(&[BackendLoad]) -> R,
) -> R {
    let remote = replicas.filter(|r| r.counts_remote());
    let take = if panic { could_take } else { eligible };
    let adjusted = |all: &[BackendLoad]| {
        let mut all = all.to_vec();
        for (i, l) in all.iter_mut().enumerate() {
            l.eligible = take(plan, excluded, i);
            if let Some(a) = remote {
                let id = plan.policy.backends[i].endpoint.id();
                let (n, blocks) = a.remote_load(&plan.target.pool.model, id);
                l.in_flight = l.in_flight.saturating_add(n);
                l.pending_prefill_blocks = l.pending_prefill_blocks.saturating_add(blocks);
            }
        }
        all
    };
    if plan.policy.learns.is_some() {
        return read(plan, agents, false, |all, _| f(&adjusted(all)));
    }
    f(&read(plan, agents, false, |all, _| adjusted(all)))
}

/// Whether position `i` of `plan`'s snapshot may take it.
fn eligible(plan: &Plan, excluded: &[usize], i: usize) -> bool {
    plan.policy.backends[i].health.is_healthy() && could_take(plan, excluded, i)
}

/// Whether position `i` could take it, health aside (panic routing).
fn could_take(plan: &Plan, excluded: &[usize], i: usize) -> bool {
    let b = &plan.policy.backends[i];
    !b.load.is_draining()
        && !excluded.contains(&i)
        && plan
            .target
            .adapter
            .as_deref()
            .is_none_or(|a| b.endpoint.serves_adapter(a))
}

/// Picks a backend for `plan`, never one in `excluded`. When every member
/// that could take it is ejected, the ejected ones take it (Envoy's panic
/// routing): an answer from a doubtful engine beats a certain 503.
pub(crate) fn pick(
    plan: &Plan,
    excluded: &[usize],
    agents: Option<&dyn AgentLoads>,
    replicas: Option<&dyn DecisionSource>,
) -> Result<Decision, ApiError> {
    let t = Instant::now();
    let pool = &plan.target.pool;
    if let Some(d) = pinned(plan, excluded) {
        return Ok(d);
    }
    // A learning policy's ties go by the key, as the preview's do, so replicas
    // of the same state agree (docs/replicas.md) and a preview tells the pick.
    let kv = plan.policy.learns.is_some();
    let mut keyed;
    let mut shared;
    let rng: &mut dyn rand::RngCore = if kv {
        keyed = SmallRng::seed_from_u64(plan.prefix_key.0);
        &mut keyed
    } else {
        shared = rand::rng();
        &mut shared
    };
    let input = input_of(plan);
    let policy = &plan.policy;
    let tracked = kv
        && excluded.is_empty()
        && plan.target.adapter.is_none()
        && !replicas.is_some_and(|r| r.counts_remote());
    let res = if tracked {
        read(plan, agents, true, |all, changed| {
            policy
                .policy
                .pick(&input, &Loads { all, changed }, &mut *rng)
        })
    } else {
        with_adjusted(plan, excluded, agents, replicas, false, |all| {
            policy.policy.pick(&input, &Loads::new(all), &mut *rng)
        })
    };
    let res = match res {
        Err(PolicyError::NoBackend)
            if (0..policy.backends.len()).any(|i| {
                !policy.backends[i].health.is_healthy() && could_take(plan, excluded, i)
            }) =>
        {
            metrics::counter!("warmpath_panic_routed_total", "pool" => pool.model.clone())
                .increment(1);
            with_adjusted(plan, excluded, agents, replicas, true, |all| {
                policy.policy.pick(&input, &Loads::new(all), rng)
            })
        }
        r => r,
    };
    observe(pool, Phase::Pick, t);
    checked(plan, res)
}

/// The backend [`pick`] would choose now, recording nothing (ties by the prefix key).
pub(crate) fn preview(
    plan: &Plan,
    agents: Option<&dyn AgentLoads>,
    replicas: Option<&dyn DecisionSource>,
) -> Result<Decision, ApiError> {
    let loads = loads(plan, agents, replicas);
    let mut rng = SmallRng::seed_from_u64(plan.prefix_key.0);
    let input = RouteInput {
        mode: Mode::Preview,
        ..input_of(plan)
    };
    let res = plan
        .policy
        .policy
        .pick(&input, &Loads::new(&loads), &mut rng);
    checked(plan, res)
}

/// The pinned backend, while it can serve; else the policy picks.
fn pinned(plan: &Plan, excluded: &[usize]) -> Option<Decision> {
    let id = plan.pinned.as_deref()?;
    let i = plan
        .policy
        .backends
        .iter()
        .position(|b| b.endpoint.id() == id)?;
    eligible(plan, excluded, i).then(|| Decision {
        backend: i,
        kind: DecisionKind::Affinity,
        matched_blocks: plan
            .matches
            .as_ref()
            .and_then(|m| m.of(plan.policy.backends[i].endpoint.slot))
            .map_or(0, |m| m.blocks),
    })
}

fn input_of(plan: &Plan) -> RouteInput<'_> {
    RouteInput {
        prefix_key: plan.prefix_key.0,
        chain_blocks: plan.hashes.len() as u32,
        matches: plan.matches.as_ref(),
        mode: Mode::Commit,
    }
}

fn checked(plan: &Plan, res: Result<Decision, PolicyError>) -> Result<Decision, ApiError> {
    let pool = &plan.target.pool;
    let members = plan.policy.backends.len();
    match res {
        Ok(d) if d.backend < members => Ok(d),
        Ok(d) => Err(ApiError::internal(format!(
            "policy picked backend {} of {members}",
            d.backend,
        ))),
        Err(PolicyError::NoBackend) => Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "no_healthy_backend",
            format!(
                "no healthy backend is available for model `{}`",
                plan.target.adapter.as_deref().unwrap_or(&pool.model)
            ),
        )),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}
