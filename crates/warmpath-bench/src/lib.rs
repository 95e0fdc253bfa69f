//! warmpath-bench: what warmpath is worth, measured.
//!
//! - [`workload`]: seeded, reproducible traces (`long`, `short`, `rag`,
//!   `code`, `tenants`) and JSONL trace replay.
//! - [`timing`]: the engine time model shared by the simulators.
//! - [`scale`]: a socket-free discrete-event simulation of a 1000-instance
//!   fleet driving the real core index and policies.
//! - [`words`], [`dist`], [`stats`]: the deterministic text generator, the
//!   distributions and the percentile helpers.

pub mod dist;
pub mod error;
pub mod scale;
pub mod stats;
pub mod timing;
pub mod words;
pub mod workload;

pub use error::BenchError;
