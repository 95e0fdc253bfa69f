//! vLLM's KV-cache events: the event model, a msgpack decoder and encoder for
//! both payload forms, the ZMQ framing, and a vLLM-compatible publisher.
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
