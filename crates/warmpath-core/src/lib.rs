//! warmpath-core: the pure heart of warmpath (no sockets, no async runtime, no
//! HTTP types), shared by the router, the agent, the engine and the bench. It
//! re-exports the hash, request, tokenize and index crates and holds [`prefix`]
//! and the routing [`policy`]. See docs/design-notes.md.

mod error;
pub mod policy;
pub mod prefix;
mod route;

// The concepts that stand alone, each its own crate.
pub use warmpath_cache_model as prefix_cache;
pub use warmpath_hash as hash;
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
pub use warmpath_hash::tenant::{TenantError, TenantId, TenantSource};
