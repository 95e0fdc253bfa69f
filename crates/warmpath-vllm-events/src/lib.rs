//! warmpath-vllm-events: vLLM's KV-cache events on the wire, both ways: as
//! vLLM publishes them (the encoder and a vLLM-compatible publisher, used by
//! the engine emulator, the simulator and the tests) and as the agent reads
//! them (the decoder and the replay client's framing). One concept, no
//! routing: the agent, the engine and the bench depend on it.
//!
//! - [`event`]: [`KvEventBatch`], [`KvEvent`], [`EngineBlockHash`], [`Medium`].
//! - [`decode`]: [`decode_batch`] (both forms, typed errors, size caps).
//! - [`encode`]: [`encode_batch`] (byte-exact with vLLM 0.33 / 0.23).
//! - [`wire`]: frames, replay requests and replies, endpoints per DP rank.
//! - [`publisher`]: [`KvEventPublisher`], PUB + replay ROUTER with test knobs.

mod count;
pub mod decode;
pub mod encode;
pub mod event;
pub mod publisher;
pub mod wire;

#[cfg(test)]
mod golden_tests;

pub use decode::{decode_batch, decode_batch_with, DecodeError, DecodeLimits};
pub use encode::encode_batch;
pub use event::{
    BlockRemoved, BlockStored, EngineBlockHash, KvEvent, KvEventBatch, Medium, PayloadForm,
};
pub use publisher::{KvEventPublisher, PublisherConfig, PublisherError};
