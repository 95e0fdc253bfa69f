//! The cache index: which workers hold which blocks, on which tier. One
//! [`CacheIndex`] per model pool, read by routing threads and written by each
//! worker's event stream: an identity-hashed `DashMap` (keys are already xxh3
//! outputs) from block hash to a compact holder set ([`holders`]). A worker is
//! cleared in O(1) by bumping its generation; [`bounds`] caps what is held and
//! [`closure`] lets a walk skip. See docs/cache-index.md.

mod bounds;
mod closure;
mod holders;
mod matching;
mod table;
mod tier;
mod workers;

pub use bounds::{Overflow, Stored};
pub use holders::WorkerSlot;
pub use matching::{MatchResult, WorkerMatch};
pub use table::{CacheIndex, IndexError};
pub use tier::Tier;
pub use workers::WorkerStats;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod walk_tests;
