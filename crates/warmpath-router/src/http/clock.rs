//! The router's monotonic clock, read by every wing.

use std::sync::OnceLock;
use std::time::Instant;

/// Milliseconds on the router's monotonic clock (the index's staleness clock).
pub(crate) fn monotonic_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}
