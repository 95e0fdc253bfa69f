//! warmpath-vllm-events: vLLM's KV-cache events on the wire, both ways: the
//! encoder and a vLLM-compatible publisher (for the engine, the simulator and
//! the tests) and the decoder and replay framing (for the agent).

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
