//! warmpath-router: an OpenAI-compatible, KV-cache-aware proxy.
//!
//! Each request is parsed only as far as routing needs ([`warmpath_core::Request`]),
//! tokenized with the pool's chat template and tokenizer, cut into blocks and
//! hashed with the shared chain hash, matched against the pool's
//! [`CacheIndex`](warmpath_core::CacheIndex) (filled by the agents), and
//! given to the pool's routing policy together with live loads. The chosen
//! backend gets the body unchanged (apart from `cache_salt`), and its answer
//! streams back frame by frame.
//!
//! Modules, in request order: `config` -> `front` (with `conn`: limits and
//! watchdogs of client connections, and `socket`) -> `api` and `surface`
//! (embeddings, responses, tokenize; with `incoming` and `tenancy`) -> `route` (with
//! `load_board`: the loads kept between picks) -> `proxy` (with `backend` load accounting and
//! `salt`, and `requests`: ids, durations, the access log); around them `pool`, `hot`, `caches`, `inspect` (`/cache-index`,
//! `/metrics`), `ui` (`/cache-index/ui`), `models` (`/v1/models`), `admin`, `health` (probes), `readiness` (`/livez`, `/readyz`), `metrics` (the recorder and series) and
//! `server` (start-up and the HTTP routes). The public API is [`config`],
//! [`start`], [`RunningRouter`] and [`ingest`] (for embedding the agents'
//! gRPC ingest); no two modules import each other.
//!
//! Embed it with [`start`]:
//!
//! ```no_run
//! # async fn f() -> Result<(), warmpath_router::RouterError> {
//! use warmpath_router::config::{BackendConfig, PoolConfig, RouterConfig};
//! let mut pool = PoolConfig::new("m");
//! pool.backends.push(BackendConfig::new("http://127.0.0.1:8001"));
//! let config = RouterConfig { listen: "127.0.0.1:0".into(), pools: vec![pool], ..Default::default() };
//! let running = warmpath_router::start(config, Default::default()).await?;
//! println!("listening on http://{}", running.http_addr);
//! # Ok(()) }
//! ```

mod access;
mod admin;
mod affinity;
mod api;
mod backend;
mod caches;
pub mod config;
mod conn;
mod discovery;
mod error;
mod front;
mod health;
mod hot;
mod incoming;
pub mod ingest;
mod inspect;
mod load_board;
pub mod load_cell;
mod members;
mod metrics;
mod models;
mod peers;
mod pool;
mod proxy;
mod readiness;
mod requests;
mod responses;
mod route;
mod salt;
mod server;
mod socket;
mod state;
mod surface;
mod tenancy;
mod ui;
mod work;

pub use config::{Cli, RouterConfig};
pub use error::{ApiError, RouterError};
pub use server::{start, RunningRouter};

use load_cell::LoadCell;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use warmpath_core::EngineLoad;

/// Engine load reported by agents, as the router reads it when routing
/// (implemented by [`ingest::Agents`]).
pub trait AgentLoads: Send + Sync {
    /// The latest load reported for `worker_id` of pool `model`, if known
    /// and recent, looked up (routing reads it through each backend's
    /// cached cell instead: `Backend::engine_load`).
    fn engine_load(&self, model: &str, worker_id: &str) -> Option<EngineLoad> {
        self.load_cell(model, worker_id)?.fresh(monotonic_ms())
    }

    /// Other router replicas' requests in flight on `worker_id` and their
    /// predicted prefill blocks, as shared through the agents (module `peers`).
    fn remote_load(&self, _model: &str, _worker_id: &str) -> (u32, u64) {
        (0, 0)
    }

    /// Bumped whenever [`load_cell`](Self::load_cell) may answer differently
    /// for some worker: a handle cached at one generation is good until the
    /// next.
    fn cell_generation(&self) -> u64;

    /// The cell holding `worker_id`'s reported load, which routing reads
    /// without a lookup once a backend cached it (`load_cell`).
    fn load_cell(&self, model: &str, worker_id: &str) -> Option<Arc<LoadCell>>;

    /// Whether this router shares its decisions with its replicas: kv_aware
    /// then breaks ties with an rng seeded by the prefix key, so replicas
    /// of the same state agree.
    fn shares_decisions(&self) -> bool {
        false
    }

    /// Whether [`remote_load`](Self::remote_load) may answer anything but
    /// zeros (a replica shared a start with this router): the load board
    /// does not track those loads, so routing then reads every backend's.
    fn remote_loads(&self) -> bool {
        false
    }
}

/// Milliseconds on the router's monotonic clock: the clock of
/// [`CacheIndex::mark_heard`](warmpath_core::CacheIndex::mark_heard) and
/// staleness in this process.
pub fn monotonic_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}
