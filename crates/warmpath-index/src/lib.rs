//! The cache index: which workers hold which blocks, on which tier.
//!
//! One [`CacheIndex`] per model pool. Many routing threads read it while each
//! worker's event stream writes it. It is a sharded concurrent map
//! (`DashMap`, identity-hashed: keys are already xxh3 outputs) from a block
//! hash to the compact set of its holders ([`holders`]).
//!
//! # Memory
//! A map slot is 24 bytes (8-byte key, 16-byte holder set) plus one control
//! byte; one or two holders are stored inline, so a block held by one worker
//! costs about 25 bytes / load factor (0.44–0.875, i.e. 29–57 bytes), and each
//! further holder about 4–8 bytes. Measured numbers are in BENCHMARKS.md
//! (`cargo bench -p warmpath-core --bench index`).
//!
//! # Clearing a worker in O(1)
//! Every holder carries its worker's generation (8 bits). Clearing a worker
//! (engine reset, new epoch, snapshot replacement) bumps the generation: old
//! holders stop counting at once and are purged lazily on the next write to
//! the block or by [`CacheIndex::compact`], which also runs by itself before a
//! generation could wrap around, and once dead holders outnumber live ones.
//!
//! # Bounds
//! A worker cap, a whole-index cap and the dead-holder accounting live in
//! [`bounds`]: a block beyond a bound is refused, not stored.
//!
//! # Skipping
//! For a worker whose agent reports its holdings prefix-closed, a walk
//! probes one block per batch instead of every block ([`closure`]).

mod bounds;
mod closure;
mod holders;
mod matching;
mod table;
mod tier;
mod workers;

pub use bounds::{Overflow, Stored, SLOT_BYTES};
pub use holders::WorkerSlot;
pub use matching::{MatchResult, WorkerMatch};
pub use table::{CacheIndex, IndexError};
pub use tier::Tier;
pub use warmpath_hash::IdentityHasher;
pub use workers::WorkerStats;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod walk_tests;
