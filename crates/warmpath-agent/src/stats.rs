//! Counters the agent keeps besides its Prometheus metrics, for `/health` and
//! for tests that must see exactly what was counted.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter (or, through [`Counter::hold`], a count of things open).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Counts one until the guard is dropped.
    pub fn hold(&self) -> Held<'_> {
        self.inc();
        Held(self)
    }
}

/// One count of a [`Counter::hold`]; dropping it takes the count back.
#[derive(Debug)]
pub struct Held<'a>(&'a Counter);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the agent counted since it started.
#[derive(Debug, Default)]
pub struct Stats {
    /// Batches decoded and applied.
    pub batches: Counter,
    /// Messages without the `[topic, seq, payload]` layout.
    pub bad_frames: Counter,
    /// Payloads that failed to decode.
    pub bad_payloads: Counter,
    /// BlockStored events with an unknown parent.
    pub unknown_parents: Counter,
    pub gaps: Counter,
    /// Gaps no replay could fill.
    pub gaps_unrecovered: Counter,
    /// Engine restarts (sequence went backwards).
    pub engine_restarts: Counter,
    /// Times an engine's event socket re-dialled a lost publisher.
    pub event_reconnects: Counter,
    pub replays_ok: Counter,
    pub router_connects: Counter,
    /// Refusals received from routers.
    pub router_refusals: Counter,
    pub router_streams: Counter,
}
