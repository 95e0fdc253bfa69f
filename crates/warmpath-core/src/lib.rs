//! warmpath-core: the pure heart of warmpath.
//!
//! No sockets, no async runtime, no HTTP types: everything here is plain data
//! and functions, shared by the router, the agent, the engine and the bench.
//!
//! - [`hash`]: the one block-hash function (xxh3, chained, seeded by model,
//!   LoRA and tenant), pinned by golden vectors.
//! - [`tenant`]: tenant id validation.
//! - [`prefix`]: what PREFIX_AWARE hashes of a request.
//! - [`index`]: the concurrent cache index (block hash -> workers, tier).
//! - [`policy`]: the routing policies behind one trait.

pub mod hash;
pub mod index;
pub mod tenant;

pub use hash::{hash_block, hash_tokens, BlockHash, ChainHasher, HashSeed};
pub use tenant::{resolve_tenant, TenantError, TenantId, TenantSource};
pub use index::{CacheIndex, IndexError, MatchResult, Tier, WorkerMatch, WorkerSlot, WorkerStats};
