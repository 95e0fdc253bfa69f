//! warmpath-bench: what warmpath is worth, measured.
//!
//! - [`workload`]: seeded, reproducible traces (`long`, `short`, `rag`,
//!   `code`, `tenants`) and JSONL trace replay.
//! - [`timing`]: the engine time model shared by the simulators.
//! - [`sim`]: a fleet of simulated vLLM instances (OpenAI HTTP, Prometheus
//!   metrics, real KV events over ZMQ) for the real agent and router.
//! - [`compare`]: the same trace once per strategy against simulated
//!   instances + real agents + the real router (in-process), with a goodput
//!   search, index fidelity and a JSON / markdown / SVG / HTML report; the
//!   `demo` is a preset of it.
//! - [`scale`]: a socket-free discrete-event simulation of a 1000-instance
//!   fleet driving the real core index and policies.
//! - [`optimum`]: offline references for the hit rate (a pooled-cache
//!   Belady bound and a per-backend Belady reference) for `compare` and
//!   `scale`, with [`lru_refs`]: references that keep the engines' LRU.
//! - [`words`], [`dist`], [`stats`]: the deterministic text generator, the
//!   distributions and the percentile helpers.

pub mod compare;
pub mod dist;
pub mod error;
pub mod lru_refs;
pub mod offline;
pub mod optimum;
pub mod scale;
pub mod sim;
pub mod stats;
pub mod timing;
pub mod words;
pub mod workload;

pub use error::BenchError;
