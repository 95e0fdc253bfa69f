//! Model pools: each owns its cache index, tokenizer, backends and the
//! current policy, which can be swapped at run time ([`Pool::switch`]).
//!
//! The policy lives behind `RwLock<Arc<PolicyState>>`: a request clones the
//! `Arc` (a read lock held for a few nanoseconds) and routes with that
//! snapshot, so a switch never disturbs requests already routed or routing.

use crate::backend::Backend;
use crate::config::{BackendUrl, IndexSettings, PoolConfig, TenantsConfig};
use crate::error::RouterError;
use crate::hot::HotChains;
use crate::metrics::PoolMetrics;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use thiserror::Error;
use warmpath_core::tokenize::ChatTokenizer;
use warmpath_core::{
    build_policy, CacheIndex, Policy, PolicyBackend, PolicyConfig, PolicyError, PrefixExtractor,
    Strategy,
};

/// The policy a pool routes with, and what it was built from.
#[derive(Debug)]
pub struct PolicyState {
    /// Strategy.
    pub strategy: Strategy,
    /// Knobs.
    pub config: PolicyConfig,
    /// The built policy.
    pub policy: Box<dyn Policy>,
}

/// Why a strategy switch was refused; the old policy stays in place.
#[derive(Debug, Error)]
pub enum SwitchError {
    /// `kv_aware` on a pool without a tokenizer. Not retryable.
    #[error("pool {0:?} has no tokenizer, so it cannot use kv_aware")]
    NeedsTokenizer(String),
    /// The policy could not be built from the settings. Not retryable.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// One model pool.
#[derive(Debug)]
pub struct Pool {
    /// The model name (`model` field of requests).
    pub model: String,
    /// Which workers hold which blocks; filled by the agents' ingest.
    pub index: Arc<CacheIndex>,
    /// Tokens per block.
    pub block_size: usize,
    /// Chat template + tokenizer, when configured.
    pub tokenizer: Option<Arc<ChatTokenizer>>,
    /// PREFIX_AWARE key extraction.
    pub prefix: PrefixExtractor,
    /// Backends, in policy snapshot order.
    pub backends: Vec<Arc<Backend>>,
    /// Warmest prefix chains routed here.
    pub hot: HotChains,
    /// The per-request metric series of this pool.
    pub metrics: PoolMetrics,
    /// Whether answers carry `x-warmpath-backend` and `x-warmpath-decision`.
    pub expose_routing_headers: bool,
    /// Where tenant ids come from and what they isolate.
    pub tenants: TenantsConfig,
    /// Whether the warmest chains keep a prompt preview (`show_prompts`).
    pub show_prompts: bool,
    /// Bounds of `index` (the ingest applies the per-worker caps).
    pub index_bounds: IndexSettings,
    policy: RwLock<Arc<PolicyState>>,
    /// `max_prompt_tokens` from the config.
    max_prompt_tokens: Option<usize>,
    /// The smallest `max_model_len` the engines' model cards gave (0: none yet).
    learned_context: AtomicUsize,
}

impl Pool {
    /// Builds a pool from its validated config; loads the tokenizer (reads files).
    pub fn build(cfg: &PoolConfig) -> Result<Self, RouterError> {
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
        let prefix = PrefixExtractor::new(cfg.prefix_aware.prefix_length).map_err(|e| {
            crate::config::invalid(format!("pool {model:?} prefix_length"), e.to_string())
        })?;
        let index = Arc::new(CacheIndex::new());
        index.set_max_entries(Some(cfg.index.max_entries));
        let mut backends = Vec::with_capacity(cfg.backends.len());
        for b in &cfg.backends {
            let url = BackendUrl::parse(&b.url)
                .map_err(|e| crate::config::invalid(format!("pool {model:?} backend"), e))?;
            let slot = index
                .register_worker(b.id())
                .map_err(|source| RouterError::Index {
                    model: model.clone(),
                    source,
                })?;
            // Until its agent reports a capacity.
            let _ = index.set_worker_cap(slot, Some(cfg.index.worker_cap(None)));
            backends.push(Arc::new(Backend::new(&model, b, url, slot)));
        }
        let pool = Pool {
            model: model.clone(),
            index,
            block_size: cfg.block_size,
            tokenizer,
            prefix,
            backends,
            hot: HotChains::default(),
            metrics: PoolMetrics::new(&model),
            max_prompt_tokens: cfg.max_prompt_tokens,
            expose_routing_headers: cfg.expose_routing_headers,
            show_prompts: cfg.show_prompts,
            tenants: cfg.tenants,
            index_bounds: cfg.index,
            learned_context: AtomicUsize::new(0),
            policy: RwLock::new(Arc::new(PolicyState {
                strategy: Strategy::Random,
                config: PolicyConfig::default(),
                policy: build_policy(Strategy::Random, &PolicyConfig::default(), &[]).map_err(
                    |source| RouterError::Policy {
                        model: model.clone(),
                        source,
                    },
                )?,
            })),
        };
        pool.switch(cfg.effective_strategy(), cfg.policy_config())
            .map_err(|e| match e {
                SwitchError::Policy(source) => RouterError::Policy { model, source },
                SwitchError::NeedsTokenizer(m) => RouterError::Config(crate::config::invalid(
                    format!("pool {m:?} tokenizer"),
                    "kv_aware needs a tokenizer",
                )),
            })?;
        Ok(pool)
    }

    /// Most prompt tokens a request may have: the configured
    /// `max_prompt_tokens`, else one less than the smallest `max_model_len`
    /// learned from the engines (vLLM refuses a prompt of `max_model_len`
    /// tokens or more), else no cap.
    pub fn prompt_cap(&self) -> Option<usize> {
        self.max_prompt_tokens.or_else(|| {
            let n = self.learned_context.load(Ordering::Relaxed);
            (n > 1).then(|| n - 1)
        })
    }

    /// `max_prompt_tokens` as configured.
    pub fn configured_prompt_cap(&self) -> Option<usize> {
        self.max_prompt_tokens
    }

    /// Records an engine's `max_model_len` (the pool keeps the smallest).
    pub fn learn_context_length(&self, max_model_len: usize) {
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
    pub fn policy(&self) -> Arc<PolicyState> {
        Arc::clone(&self.policy.read())
    }

    /// Builds and installs a new policy atomically; returns the previous strategy.
    pub fn switch(
        &self,
        strategy: Strategy,
        config: PolicyConfig,
    ) -> Result<Strategy, SwitchError> {
        if strategy == Strategy::KvAware && self.tokenizer.is_none() {
            return Err(SwitchError::NeedsTokenizer(self.model.clone()));
        }
        let snapshot: Vec<PolicyBackend> = self
            .backends
            .iter()
            .map(|b| PolicyBackend {
                id: b.id.clone(),
                slot: b.slot,
                capacity_blocks: None,
            })
            .collect();
        let policy = build_policy(strategy, &config, &snapshot)?;
        let new = Arc::new(PolicyState {
            strategy,
            config,
            policy,
        });
        let old = std::mem::replace(&mut *self.policy.write(), new);
        tracing::info!(pool = %self.model, from = %old.strategy, to = %strategy, "routing policy installed");
        Ok(old.strategy)
    }
}

/// Every pool, by model, with LoRA adapter resolution.
#[derive(Debug, Default)]
pub struct Pools {
    list: Vec<Arc<Pool>>,
    by_model: HashMap<String, Arc<Pool>>,
}

/// A request's model resolved to a pool (and maybe one of its adapters).
#[derive(Clone, Debug)]
pub struct Target {
    /// The pool.
    pub pool: Arc<Pool>,
    /// The LoRA adapter named by the request, if `model` was an adapter.
    pub adapter: Option<String>,
}

impl Pools {
    /// Builds every pool of a validated configuration.
    pub fn build(pools: &[PoolConfig]) -> Result<Self, RouterError> {
        let mut out = Pools::default();
        for cfg in pools {
            let pool = Arc::new(Pool::build(cfg)?);
            out.by_model.insert(pool.model.clone(), Arc::clone(&pool));
            out.list.push(pool);
        }
        Ok(out)
    }

    /// All pools, in configuration order.
    pub fn all(&self) -> &[Arc<Pool>] {
        &self.list
    }

    /// The pool of base model `model`.
    pub fn get(&self, model: &str) -> Option<&Arc<Pool>> {
        self.by_model.get(model)
    }

    /// The pool serving `model`: a base model, or a LoRA adapter served by
    /// at least one backend of a pool.
    pub fn resolve(&self, model: &str) -> Option<Target> {
        if let Some(pool) = self.by_model.get(model) {
            return Some(Target {
                pool: Arc::clone(pool),
                adapter: None,
            });
        }
        self.list
            .iter()
            .find(|p| p.backends.iter().any(|b| b.serves_adapter(model)))
            .map(|p| Target {
                pool: Arc::clone(p),
                adapter: Some(model.to_owned()),
            })
    }

    /// `(index, block_size)` of the pool of `model`, for the agents' ingest.
    pub fn index_of(&self, model: &str) -> Option<(Arc<CacheIndex>, usize)> {
        self.by_model
            .get(model)
            .map(|p| (Arc::clone(&p.index), p.block_size))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::BackendConfig;

    fn cfg() -> PoolConfig {
        let mut p = PoolConfig::new("m");
        p.backends = vec![
            BackendConfig::new("http://127.0.0.1:1"),
            BackendConfig {
                url: "http://127.0.0.1:2".into(),
                worker_id: Some("b".into()),
                adapters: vec!["sql".into()],
            },
        ];
        p
    }

    #[test]
    fn pools_register_backends_and_resolve_adapters() {
        let pools = Pools::build(&[cfg()]).unwrap();
        let p = pools.get("m").unwrap();
        assert_eq!(p.index.worker_slot("b"), Some(p.backends[1].slot));
        assert_eq!(p.policy().strategy, Strategy::PrefixAware);
        let t = pools.resolve("sql").unwrap();
        assert_eq!(t.adapter.as_deref(), Some("sql"));
        assert_eq!(t.pool.model, "m");
        assert!(pools.resolve("m").unwrap().adapter.is_none());
        assert!(pools.resolve("other").is_none());
        assert_eq!(pools.index_of("m").unwrap().1, 16);
    }

    #[test]
    fn switching_swaps_the_policy_and_refuses_kv_without_tokenizer() {
        let pools = Pools::build(&[cfg()]).unwrap();
        let p = pools.get("m").unwrap();
        let before = p.policy();
        let prev = p.switch(Strategy::Random, PolicyConfig::default()).unwrap();
        assert_eq!(prev, Strategy::PrefixAware);
        assert_eq!(p.policy().strategy, Strategy::Random);
        assert_eq!(
            before.strategy,
            Strategy::PrefixAware,
            "old snapshot unchanged"
        );
        assert!(matches!(
            p.switch(Strategy::KvAware, PolicyConfig::default()),
            Err(SwitchError::NeedsTokenizer(_))
        ));
        assert_eq!(p.policy().strategy, Strategy::Random);
    }
}
