//! The cache index: which workers hold which blocks, on which tier. One
//! [`CacheIndex`] per model pool, read by routing threads and written by each
//! worker's event stream; its layout and rules are in docs/cache-index.md.

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
