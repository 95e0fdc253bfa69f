//! warmpath-openai: the one vLLM-compatible OpenAI server, shared by
//! `warmpath-engine` (a real forward pass) and the bench's simulated fleet.
//!
//! A backend implements [`Backend`]: it supplies its [`ServerConfig`], its
//! tokenizer, how it generates (a stream of [`Item`]s), how it resets its
//! prefix cache and its [`VllmStats`]. Everything a client sees is here, once:
//!
//! - [`server`]: the routes (`POST /v1/chat/completions`, `POST /v1/completions`,
//!   streamed or not, `GET /v1/models`, `GET /health`, `GET /metrics`,
//!   `POST /reset_prefix_cache`), request validation and the SSE relay;
//! - [`body`]: response bodies as vLLM writes them, with
//!   `usage.prompt_tokens_details.cached_tokens`;
//! - [`error`]: error answers in vLLM's shape;
//! - [`vllm_metrics`]: `/metrics` with vLLM's metric names.
//!
//! It depends on axum, serde, tokio and `warmpath-core` (the request reader and
//! chat tokenizer both backends already use), never on candle, so the bench
//! gets the server without the engine.

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
