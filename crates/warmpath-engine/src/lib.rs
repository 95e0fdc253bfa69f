//! warmpath-engine: a small OpenAI-compatible Llama engine on candle with a
//! block-level prefix cache that reports vLLM-style KV events.
//!
//! It exists so that warmpath can be tested end to end (on a CPU, or on a GPU
//! with `--features cuda`) without vLLM, and so that the benefit of a warm
//! prefix cache is measured on a real forward pass.
//!
//! - [`config`]: the Llama shape (`config.json` or the `--tiny` shape).
//! - [`weights`]: safetensors loading and deterministic random weights.
//! - [`model`]: the forward pass over past K/V (RMSNorm, RoPE, GQA, SwiGLU).
//! - [`kv`]: per-layer K/V of a run of positions; blocks are slices of it.
//! - [`engine`]: prefix lookup, suffix prefill, block storage, greedy decode.
//! - [`loader`]: model folder, `--tiny` or a size preset to a ready model + tokenizer.
//! - [`model_dir`]: writes a Hugging Face style model folder (random weights,
//!   the tiny tokenizer) that `--model-dir` loads.
//! - [`device`]: `--device cpu|cuda[:N]` and `--dtype`.
//! - [`worker`]: the one thread that runs the engine, behind a bounded queue.
//! - `events` (feature `kv-events`, default): vLLM-style KV events over ZMQ.
//! - [`http`]: the engine behind the shared vLLM-compatible server
//!   ([`warmpath_openai`]); [`detok`]: incremental detokenization for it.
//!
//! Concurrency: one worker thread owns the [`engine::Engine`]; requests wait
//! in a bounded FIFO queue and run one at a time (no batching).

pub mod config;
pub mod detok;
pub mod device;
pub mod engine;
pub mod error;
#[cfg(feature = "kv-events")]
pub mod events;
pub mod http;
pub mod kv;
pub mod loader;
pub mod model;
pub mod model_dir;
pub mod weights;
pub mod worker;

pub use engine::{Engine, EngineOptions, EventSink, Finish, Generation, NoEvents, Prefill};
pub use error::EngineError;
pub use loader::{load, LoadedModel, ModelSource, SizePreset};
