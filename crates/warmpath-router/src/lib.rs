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
//! The router is five wings, one folder each, around `config` (the one
//! config struct) and `server` (start-up: builds the pools, binds, spawns
//! the tasks and wires the HTTP routes):
//!
//! - `http`: accept, client connections and their limits, sockets, request
//!   ids and the access log, reading bodies, the work pool, error answers;
//! - `api`: the OpenAI and native handlers, the rest of the request surface,
//!   tenancy and salting, stored responses, `/v1/models`;
//! - `routing`: plan and pick, forwarding to the engine, pools, backends,
//!   response affinity, loads;
//! - `control`: admin, access checks, membership and discovery, health
//!   probes, readiness, `/cache-index` and its page, metrics, the handler
//!   state;
//! - `ingest`: the agents' gRPC streams and the decisions replicas share.
//!
//! The public API is [`config`], [`start`], [`RunningRouter`] and
//! [`ingest`] (for embedding the agents' gRPC ingest). `tests/module_graph.rs`
//! checks that no two modules import each other and the rules between the
//! wings.
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

mod api;
pub mod config;
mod control;
mod http;
pub mod ingest;
mod routing;
mod server;

pub use config::{Cli, RouterConfig};
pub use http::error::{ApiError, RouterError};
pub use http::requests::ACCESS_TARGET;
pub use server::{start, RunningRouter};
