//! warmpath-engine: a small OpenAI-compatible Llama engine on candle with a
//! block-level prefix cache that reports vLLM-style KV events, so warmpath can be
//! tested end to end without vLLM and a warm prefix is measured on a real forward
//! pass. One worker thread owns the [`engine::Engine`]; requests wait in a bounded
//! FIFO queue and run one at a time (no batching).

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
