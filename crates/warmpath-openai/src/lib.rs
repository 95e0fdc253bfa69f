//! warmpath-openai: the one vLLM-compatible OpenAI server, shared by
//! `warmpath-engine` and the bench's simulated fleet. A backend implements
//! [`Backend`]; routes, bodies, errors and `/metrics` are written here once, as
//! vLLM writes them. It never depends on candle, so the bench gets the server
//! without the engine.

pub mod body;
pub mod error;
pub mod server;
pub mod vllm_metrics;

pub use body::{Kind, Meta};
pub use error::ApiError;
pub use server::{router, Backend, Generation, Item, Job, ServerConfig};
pub use vllm_metrics::VllmStats;

#[cfg(test)]
mod tests;
