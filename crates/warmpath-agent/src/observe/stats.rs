//! What observe mode counts.

use crate::stats::Counter;

/// What observe mode counted (also in `/warmpath/health`).
#[derive(Debug, Default)]
pub struct ObserveStats {
    /// Requests forwarded to the engine.
    pub forwarded: Counter,
    /// Requests the engine could not be reached for (answered 502).
    pub engine_errors: Counter,
    /// Prompts hashed into the mirror.
    pub observed: Counter,
    /// Observations dropped because the queue was full.
    pub dropped: Counter,
    /// Bodies that could not be hashed (bad JSON, tenant, template).
    pub unhashable: Counter,
    /// Blocks newly stored in the mirror.
    pub blocks_stored: Counter,
    /// Blocks evicted from the mirror.
    pub blocks_evicted: Counter,
}
