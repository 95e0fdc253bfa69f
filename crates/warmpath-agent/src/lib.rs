//! warmpath-agent: runs beside one engine instance and tells every router which
//! KV-cache blocks that instance holds.
//!
//! - vLLM's KV-event wire format (decode, and the publisher the engine and
//!   tests use) is the `warmpath-vllm-events` crate.
//! - [`tracker`]: one engine rank's `vLLM hash -> warmpath hash` map; re-hashing.
//! - [`hub`]: the worker's block set (union of ranks), the agent's seq, and the
//!   bounded, coalescing per-router queues; `closure`: whether that set is
//!   prefix-closed, said with every delta and snapshot.
//! - [`follow`]: ZMQ SUB + DEALER replay for one rank, sequence handling;
//!   [`zmtp_guard`]: the relay that refuses oversized ZMTP frames first.
//! - [`link`]: one gRPC stream per router, with reconnect; [`tls`]: the
//!   client TLS settings for `https` routers; [`replicas`]: the router list,
//!   `dns://NAME:PORT` entries followed to one link per resolved replica.
//! - [`load`]: the engine's Prometheus load metrics.
//! - [`ready`]: readiness (engine reachable, a router stream up, KV events
//!   flowing) for `/readyz` and its gauges.
//! - [`fasthash`]: the seeded fast hasher of the block maps.
//! - [`serve`]: the HTTP server's accept loop: connection cap, header and
//!   idle deadlines.
//! - [`agent`]: wiring, `/metrics`, `/livez`, `/readyz` and `/health`; [`cli`]: the command line;
//!   [`AgentError`]: why it could not start.

pub mod agent;
pub mod cli;
mod closure;
mod error;
pub mod fasthash;
pub mod follow;
pub mod hub;
pub mod link;
pub mod load;
pub mod ready;
pub mod replay;
pub mod replicas;
mod series;
pub mod serve;
pub mod stats;
pub mod tls;
pub mod tracker;
pub mod zmtp_guard;

pub use agent::{Agent, AgentConfig};
pub use error::AgentError;
