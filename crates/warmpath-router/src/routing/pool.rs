//! Model pools. A switch or membership change swaps in a new `PolicyState`
//! holding the backends it was built from, so a decision's position always
//! names the backend it was made for.

use crate::config::{BackendConfig, BackendUrl, IndexSettings, PoolConfig, TenantsConfig};
use crate::control::discovery::provider::Provider;
use crate::control::metrics::PoolMetrics;
use crate::http::error::{ApiError, RouterError};
use crate::routing::affinity::ResponseHomes;
use crate::routing::backend::{Backend, Origin};
use crate::routing::hot::HotChains;
use crate::routing::loads::Board;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use thiserror::Error;
use warmpath_core::tokenize::ChatTokenizer;
use warmpath_core::{
    build_policy, Built, CacheIndex, Learns, Policy, PolicyBackend, PolicyConfig, PolicyError,
    PrefixExtractor, Strategy,
};

/// The policy a pool routes with, and what it was built from.
#[derive(Debug)]
pub(crate) struct PolicyState {
    pub strategy: Strategy,
    pub config: PolicyConfig,
    pub policy: Arc<dyn Policy>,
    /// Its memory, when it has one (kv_aware).
    pub learns: Option<Arc<dyn Learns>>,
    /// The backends it was built from, in its snapshot order.
    pub backends: Arc<[Arc<Backend>]>,
    /// Their loads as its last pick saw them.
    pub board: Board,
}

impl PolicyState {
    /// `built` over `backends`, its loads not yet seen.
    fn new(built: Built, config: PolicyConfig, backends: Arc<[Arc<Backend>]>) -> Self {
        PolicyState {
            strategy: built.strategy,
            config,
            policy: built.policy,
            learns: built.learns,
            backends,
            board: Board::default(),
        }
    }
}

/// Why a membership change was refused; the pool is unchanged.
#[derive(Debug, Error)]
pub(crate) enum MemberError {
    #[error("pool {model:?} already has a backend with worker_id {worker_id:?}")]
    Duplicate { model: String, worker_id: String },
    #[error("pool {model:?} has no backend with worker_id {worker_id:?}")]
    Unknown { model: String, worker_id: String },
    #[error("invalid backend: {0}")]
    Invalid(String),
    /// Retryable after adding another backend.
    #[error("pool {0:?} would have no backend left; add another first")]
    LastBackend(String),
    #[error(transparent)]
    Index(#[from] warmpath_core::IndexError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// Why a strategy switch was refused; the old policy stays in place.
#[derive(Debug, Error)]
pub(crate) enum SwitchError {
    #[error("pool {0:?} has no tokenizer, so it cannot use kv_aware")]
    NeedsTokenizer(String),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

impl SwitchError {
    /// As a start-up (or reload) error of pool `model`.
    pub(crate) fn into_router_error(self, model: &str) -> RouterError {
        match self {
            SwitchError::Policy(source) => RouterError::Policy {
                model: model.to_owned(),
                source,
            },
            SwitchError::NeedsTokenizer(m) => RouterError::Config(crate::config::invalid(
                format!("pool {m:?} tokenizer"),
                "kv_aware needs a tokenizer (tokenizers load only at start)",
            )),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Pool {
    /// The model name (`model` field of requests).
    pub model: String,
    /// Which workers hold which blocks; filled by the agents' ingest.
    pub index: Arc<CacheIndex>,
    pub block_size: usize,
    pub tokenizer: Option<Arc<ChatTokenizer>>,
    /// PREFIX_AWARE key extraction.
    pub prefix: PrefixExtractor,
    /// Warmest prefix chains routed here.
    pub hot: HotChains,
    pub metrics: PoolMetrics,
    pub expose_routing_headers: bool,
    pub tenants: TenantsConfig,
    pub show_prompts: bool,
    /// Bounds of `index` (the ingest applies the per-worker caps).
    pub index_bounds: IndexSettings,
    pub discovery: Vec<Arc<Provider>>,
    /// Which backend stored which `/v1/responses` response.
    pub responses: ResponseHomes,
    policy: RwLock<Arc<PolicyState>>,
    /// Held while a new policy state is built and installed, so two changes never lose one another.
    changing: Mutex<()>,
    /// Held while a failure may eject a member (two cannot both pass the room check).
    pub ejecting: Mutex<()>,
    compaction: Compaction,
    /// As configured; [`Pool::prompt_cap`] is the cap in effect.
    pub max_prompt_tokens: Option<usize>,
    /// The smallest `max_model_len` the engines' model cards gave (0: none yet).
    learned_context: AtomicUsize,
}

impl Pool {
    /// Builds a pool from its validated config; loads the tokenizer (reads files).
    pub(crate) fn build(cfg: &PoolConfig) -> Result<Self, RouterError> {
        let model = cfg.model.clone();
        let tokenizer = match &cfg.tokenizer {
            Some(path) => Some(Arc::new(ChatTokenizer::load(path).map_err(|source| {
                RouterError::Tokenizer {
                    model: model.clone(),
                    path: path.clone(),
                    source,
                }
            })?)),
            None => None,
        };
        let prefix = PrefixExtractor::new(crate::config::PREFIX_LENGTH).map_err(|e| {
            crate::config::invalid(format!("pool {model:?} prefix length"), e.to_string())
        })?;
        let index = Arc::new(CacheIndex::new());
        index.set_max_entries(Some(cfg.index.max_entries));
        let mut backends = Vec::with_capacity(cfg.backends.len());
        for b in &cfg.backends {
            let url = BackendUrl::parse(&b.url).map_err(|e| {
                crate::config::invalid(format!("pool {model:?} backend"), e.to_string())
            })?;
            let slot =
                register(&index, &cfg.index, b.id()).map_err(|source| RouterError::Index {
                    model: model.clone(),
                    source,
                })?;
            backends.push(Arc::new(Backend::new(&model, b, url, slot, Origin::Config)));
        }
        let backends: Arc<[Arc<Backend>]> = backends.into();
        let pool = Pool {
            model: model.clone(),
            index,
            block_size: cfg.block_size,
            tokenizer,
            prefix,
            hot: HotChains::default(),
            metrics: PoolMetrics::new(&model),
            max_prompt_tokens: cfg.max_prompt_tokens,
            expose_routing_headers: cfg.expose_routing_headers,
            show_prompts: cfg.show_prompts,
            tenants: cfg.tenants,
            index_bounds: cfg.index,
            discovery: cfg
                .discovery
                .iter()
                .map(|d| Arc::new(Provider::new(d.clone())))
                .collect(),
            responses: ResponseHomes::new(crate::routing::affinity::RESPONSE_IDS),
            learned_context: AtomicUsize::new(0),
            changing: Mutex::new(()),
            ejecting: Mutex::new(()),
            compaction: Compaction::default(),
            policy: RwLock::new(Arc::new(PolicyState::new(
                build_policy(Strategy::Random, &PolicyConfig::default(), &[], None).map_err(
                    |source| RouterError::Policy {
                        model: model.clone(),
                        source,
                    },
                )?,
                PolicyConfig::default(),
                backends,
            ))),
        };
        pool.switch(cfg.effective_strategy(), cfg.policy_config())
            .map_err(|e| e.into_router_error(&model))?;
        Ok(pool)
    }

    /// Most prompt tokens a request may have: `max_prompt_tokens`, else the
    /// engines' smallest `max_model_len` - 1 (vLLM refuses more).
    pub(crate) fn prompt_cap(&self) -> Option<usize> {
        self.max_prompt_tokens.or_else(|| {
            let n = self.learned_context.load(Ordering::Relaxed);
            (n > 1).then(|| n - 1)
        })
    }

    /// Records an engine's `max_model_len` (the pool keeps the smallest).
    pub(crate) fn learn_context_length(&self, max_model_len: usize) {
        let smaller = |old: usize| (old == 0 || max_model_len < old).then_some(max_model_len);
        if self
            .learned_context
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, smaller)
            .is_ok()
        {
            tracing::info!(pool = %self.model, max_model_len, "context length learned from an engine's model card");
        }
    }

    /// The policy to route the next request with.
    pub(crate) fn policy(&self) -> Arc<PolicyState> {
        Arc::clone(&self.policy.read())
    }

    /// The current members, in policy snapshot order.
    pub(crate) fn backends(&self) -> Arc<[Arc<Backend>]> {
        Arc::clone(&self.policy.read().backends)
    }

    /// Whether one more member may be ejected: at most `max_percent` are out at
    /// once (one always may be). The caller holds [`Pool::ejecting`].
    pub(crate) fn room_to_eject(&self, max_percent: u8) -> bool {
        let members = self.backends();
        let out = members.iter().filter(|b| !b.health.is_healthy()).count();
        let cap = (members.len() * usize::from(max_percent) / 100).max(1);
        let room = out < cap;
        if !room {
            metrics::counter!("warmpath_ejections_refused_total", "pool" => self.model.clone())
                .increment(1);
        }
        room
    }

    pub(crate) fn backend(&self, id: &str) -> Option<Arc<Backend>> {
        self.backends()
            .iter()
            .find(|b| b.endpoint.id() == id)
            .cloned()
    }

    fn unknown(&self, id: &str) -> MemberError {
        MemberError::Unknown {
            model: self.model.clone(),
            worker_id: id.to_owned(),
        }
    }

    /// Builds and installs a new policy atomically; returns the previous strategy.
    pub(crate) fn switch(
        &self,
        strategy: Strategy,
        config: PolicyConfig,
    ) -> Result<Strategy, SwitchError> {
        if strategy == Strategy::KvAware && self.tokenizer.is_none() {
            return Err(SwitchError::NeedsTokenizer(self.model.clone()));
        }
        let _changing = self.changing.lock();
        let old = self.policy();
        let built = build_policy(strategy, &config, &snapshot(&old.backends), None)?;
        let backends = Arc::clone(&old.backends);
        *self.policy.write() = Arc::new(PolicyState::new(built, config, backends));
        tracing::info!(pool = %self.model, from = %old.strategy, to = %strategy, "routing policy installed");
        Ok(old.strategy)
    }

    /// Rebuilds the current policy over `backends`, carrying what it learned
    /// per worker id (`Learns::carried`); the caller holds `changing`.
    fn set_members(&self, backends: Vec<Arc<Backend>>) -> Result<(), MemberError> {
        let cur = self.policy();
        let backends: Arc<[Arc<Backend>]> = backends.into();
        let previous = Built {
            strategy: cur.strategy,
            policy: Arc::clone(&cur.policy),
            learns: cur.learns.clone(),
        };
        let built = build_policy(
            cur.strategy,
            &cur.config,
            &snapshot(&backends),
            Some(&previous),
        )?;
        *self.policy.write() = Arc::new(PolicyState::new(built, cur.config.clone(), backends));
        Ok(())
    }

    /// Adds a backend (it takes requests at once); the others keep their index entries.
    pub(crate) fn add_backend(
        &self,
        cfg: &BackendConfig,
        origin: Origin,
    ) -> Result<Arc<Backend>, MemberError> {
        let url = BackendUrl::parse(&cfg.url).map_err(|e| MemberError::Invalid(e.to_string()))?;
        let id = cfg.id();
        if id.is_empty() || id.len() > 256 {
            return Err(MemberError::Invalid(
                "worker_id must be 1 to 256 bytes".into(),
            ));
        }
        let _changing = self.changing.lock();
        let mut members = self.backends().to_vec();
        if members.iter().any(|b| b.endpoint.id() == id) {
            return Err(MemberError::Duplicate {
                model: self.model.clone(),
                worker_id: id.to_owned(),
            });
        }
        let slot = register(&self.index, &self.index_bounds, id)?;
        let b = Arc::new(Backend::new(&self.model, cfg, url, slot, origin));
        members.push(Arc::clone(&b));
        if let Err(e) = self.set_members(members) {
            self.index.drop_worker(id);
            return Err(e);
        }
        tracing::info!(pool = %self.model, backend = %id, url = %b.endpoint.url, "backend added");
        Ok(b)
    }

    /// Removes a backend now (requests in flight there finish); with
    /// `keep_one`, refuses to remove the last backend not draining.
    pub(crate) fn remove_backend(
        &self,
        id: &str,
        keep_one: bool,
    ) -> Result<Arc<Backend>, MemberError> {
        let _changing = self.changing.lock();
        let mut members = self.backends().to_vec();
        let Some(at) = members.iter().position(|b| b.endpoint.id() == id) else {
            return Err(self.unknown(id));
        };
        let serving = members.iter().filter(|b| !b.load.is_draining()).count();
        if keep_one && serving <= 1 && !members[at].load.is_draining() {
            return Err(MemberError::LastBackend(self.model.clone()));
        }
        let b = members.remove(at);
        self.set_members(members)?;
        self.index.drop_worker(id);
        b.retire();
        tracing::info!(pool = %self.model, backend = %id, "backend removed");
        Ok(b)
    }

    /// Puts `old` (a draining member) back in rotation as a new member of the
    /// same worker and slot, so its index entries and placements stay.
    pub(crate) fn restore_backend(&self, old: &Arc<Backend>) -> Result<Arc<Backend>, MemberError> {
        let _changing = self.changing.lock();
        let mut members = self.backends().to_vec();
        let Some(at) = members.iter().position(|b| Arc::ptr_eq(b, old)) else {
            return Err(self.unknown(old.endpoint.id()));
        };
        let b = Arc::new(Backend::new(
            &self.model,
            &old.endpoint.configured,
            old.endpoint.url.clone(),
            old.endpoint.slot,
            old.endpoint.origin.clone(),
        ));
        b.endpoint.set_learned_adapters(old.endpoint.adapters());
        b.endpoint.set_learned_cards(old.endpoint.learned_cards());
        members[at] = Arc::clone(&b);
        self.set_members(members)?;
        tracing::info!(pool = %self.model, backend = %b.endpoint.id(), "backend back in rotation");
        Ok(b)
    }

    /// Purges removed workers' holders on the blocking pool, one pass at a time.
    pub(crate) fn compact_removed(self: &Arc<Self>) {
        if self.index.awaiting_compaction() == 0 {
            return;
        }
        self.compaction.again.store(true, Ordering::Release);
        if self.compaction.running.swap(true, Ordering::AcqRel) {
            return; // the pass under way runs again
        }
        let p = Arc::clone(self);
        let pass = move || loop {
            while p.compaction.again.swap(false, Ordering::AcqRel) {
                let n = p.index.compact();
                tracing::debug!(pool = %p.model, blocks = n, "index compacted after a removal");
            }
            p.compaction.running.store(false, Ordering::Release);
            // A call between the last check and the release saw it running.
            if !p.compaction.again.load(Ordering::Acquire)
                || p.compaction.running.swap(true, Ordering::AcqRel)
            {
                return;
            }
        };
        // Without a runtime (unit tests): here.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(pass)),
            Err(_) => pass(),
        }
    }

    /// Starts draining a backend (no new requests); refuses the last one not draining.
    pub(crate) fn drain_backend(&self, id: &str) -> Result<Arc<Backend>, MemberError> {
        let _changing = self.changing.lock();
        let members = self.backends();
        let Some(b) = members.iter().find(|b| b.endpoint.id() == id) else {
            return Err(self.unknown(id));
        };
        let serving = members.iter().filter(|b| !b.load.is_draining()).count();
        if serving <= 1 && !b.load.is_draining() {
            return Err(MemberError::LastBackend(self.model.clone()));
        }
        if b.load.start_draining() {
            tracing::info!(pool = %self.model, backend = %id, in_flight = b.load.in_flight(), "backend draining");
        }
        Ok(Arc::clone(b))
    }
}

/// Whether a compaction after a removal runs, and whether one more is due.
#[derive(Debug, Default)]
struct Compaction {
    running: AtomicBool,
    again: AtomicBool,
}

/// Registers worker `id` in `index`, capped as one whose capacity is not known yet.
fn register(
    index: &CacheIndex,
    bounds: &IndexSettings,
    id: &str,
) -> Result<warmpath_core::WorkerSlot, warmpath_core::IndexError> {
    let slot = index.register_worker(id)?;
    let _ = index.set_worker_cap(slot, Some(bounds.worker_cap(None)));
    Ok(slot)
}

/// What a policy is built from: each member's id and index slot.
fn snapshot(backends: &[Arc<Backend>]) -> Vec<PolicyBackend> {
    backends
        .iter()
        .map(|b| PolicyBackend {
            id: b.endpoint.id().to_owned(),
            slot: b.endpoint.slot,
            capacity_blocks: None,
        })
        .collect()
}

/// Every pool, by model, with LoRA adapter resolution.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    /// All pools, in configuration order.
    pub all: Vec<Arc<Pool>>,
    by_model: HashMap<String, Arc<Pool>>,
}

/// A request's model resolved to a pool (and maybe one of its adapters).
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub pool: Arc<Pool>,
    /// The LoRA adapter named by the request, if `model` was an adapter.
    pub adapter: Option<String>,
}

impl Pools {
    /// Builds every pool of a validated configuration.
    pub(crate) fn build(pools: &[PoolConfig]) -> Result<Self, RouterError> {
        let mut out = Pools::default();
        for cfg in pools {
            let pool = Arc::new(Pool::build(cfg)?);
            out.by_model.insert(pool.model.clone(), Arc::clone(&pool));
            out.all.push(pool);
        }
        Ok(out)
    }

    pub(crate) fn get(&self, model: &str) -> Option<&Arc<Pool>> {
        self.by_model.get(model)
    }

    /// The pool serving `model`: a base model, or a LoRA adapter of a backend
    /// (else 404 `model_not_found`).
    pub(crate) fn target(&self, model: &str) -> Result<Target, ApiError> {
        if let Some(pool) = self.by_model.get(model) {
            return Ok(Target {
                pool: Arc::clone(pool),
                adapter: None,
            });
        }
        self.all
            .iter()
            .find(|p| {
                p.backends()
                    .iter()
                    .any(|b| b.endpoint.serves_adapter(model))
            })
            .map(|p| Target {
                pool: Arc::clone(p),
                adapter: Some(model.to_owned()),
            })
            .ok_or_else(|| ApiError::unknown_model(model))
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
