//! warmpath-core: the pure heart of warmpath.
//!
//! No sockets, no async runtime, no HTTP types: everything here is plain data
//! and functions, shared by the router, the agent, the engine and the bench.
//!
//! - [`hash`] (the `warmpath-hash` crate): the one block-hash function (xxh3,
//!   chained, seeded by model, LoRA and tenant), pinned by golden vectors;
//!   [`tenant`]: tenant id validation.
//! - [`request`] (the `warmpath-request` crate): an OpenAI chat/completion
//!   request reduced to what routing reads.
//! - [`prefix`]: what PREFIX_AWARE hashes of a request.
//! - `tokenize` (the `warmpath-tokenize` crate, feature `tokenizer`): chat
//!   templates, tokenization by one fast path with a chunk memo, and the
//!   generated tiny test tokenizer.
//! - [`index`] (the `warmpath-index` crate): the concurrent cache index
//!   (block hash -> workers, tier).
//! - [`policy`]: the routing policies behind one trait.

pub mod policy;
pub mod prefix;

// The concepts that stand alone, each its own crate, under their old paths.
pub use warmpath_cache_model as prefix_cache;
pub use warmpath_hash as hash;
pub use warmpath_hash::tenant;
pub use warmpath_index as index;
pub use warmpath_request as request;
#[cfg(feature = "tokenizer")]
pub use warmpath_tokenize as tokenize;

pub use hash::{hash_block, hash_tokens, BlockHash, ChainHasher, HashSeed};
pub use index::{CacheIndex, IndexError, MatchResult, Tier, WorkerMatch, WorkerSlot, WorkerStats};
pub use policy::{
    build_policy, BackendLoad, Built, Decision, DecisionKind, EngineLoad, Learns, Loads, Policy,
    PolicyBackend, PolicyConfig, PolicyError, RouteInput, Strategy,
};
pub use prefix::{PrefixError, PrefixExtractor, PrefixKey};
pub use request::{Expect, Request, RequestBody, RequestError};
pub use tenant::{resolve_tenant, TenantError, TenantId, TenantSource};
