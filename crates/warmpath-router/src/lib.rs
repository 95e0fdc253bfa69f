//! warmpath-router: an OpenAI-compatible, KV-cache-aware proxy. Its wings
//! (`http`, `api`, `routing`, `control`, `ingest`) and their import rules are
//! in ARCHITECTURE.md; the public API is [`config`], [`start`],
//! [`RunningRouter`] and [`ingest`].
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
