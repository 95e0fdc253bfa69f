//! The load this router put on a backend and what routing reads of it:
//! requests in flight, predicted prefill blocks still waiting for a first
//! byte, whether it is draining, its worker's reported engine load (through
//! a cached load cell) and the change counter the load board polls.
//!
//! Membership (`crate::control::members`) drains a backend before removing
//! it: a *draining* backend gets no new requests; [`Load::wait_idle`]
//! returns once its last request in flight has ended.

use crate::routing::load_cell::{CellCache, LoadCell};
use crate::routing::loads::AgentLoads;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Requests in flight, pending prefill, draining and the load cell of one
/// backend.
pub(crate) struct Load {
    /// `warmpath_backend_in_flight` of this backend.
    in_flight_gauge: metrics::Gauge,
    in_flight: AtomicU32,
    pending_prefill: AtomicU64,
    /// Taken out of rotation for removal (no new requests).
    draining: AtomicBool,
    /// Woken when a draining backend's last request ends.
    idle: Notify,
    /// Its worker's reported engine load, found once per registry
    /// generation ([`crate::routing::load_cell`]).
    load_cell: CellCache,
    /// Bumped after every change of what routing reads of the backend (in
    /// flight, pending prefill, ejected, draining): the load board re-reads
    /// only backends whose count moved ([`crate::routing::load_board`]).
    changes: AtomicU64,
}

impl std::fmt::Debug for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Load")
            .field("in_flight", &self.in_flight)
            .field("pending_prefill", &self.pending_prefill)
            .field("draining", &self.draining)
            .finish_non_exhaustive()
    }
}

impl Load {
    /// No load on backend `id` of pool `model` yet.
    pub(crate) fn new(model: &str, id: &str) -> Self {
        Load {
            in_flight_gauge: crate::control::metrics::backend_in_flight(model, id),
            in_flight: AtomicU32::new(0),
            pending_prefill: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            idle: Notify::new(),
            load_cell: CellCache::default(),
            changes: AtomicU64::new(0),
        }
    }

    /// How many times what routing reads of the backend changed (see
    /// `changes`); read before the values, so a change racing the read
    /// shows next time.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Counts a change of what routing reads, after it is made.
    pub(super) fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// The engine load worker `worker`'s agent reported, if recent (`agents`
    /// of pool `model`, read through the cached cell: no lookup per request).
    pub(super) fn engine_load(
        &self,
        model: &str,
        worker: &str,
        agents: &dyn AgentLoads,
        now_ms: u64,
    ) -> Option<warmpath_core::EngineLoad> {
        self.load_cell
            .read(
                agents.cell_generation(),
                || agents.load_cell(model, worker),
                |c| c.fresh(now_ms),
            )
            .flatten()
    }

    /// Worker `worker`'s load cell in `agents`' current generation (what
    /// [`Load::engine_load`] reads), for the load board to keep.
    pub(super) fn load_cell(
        &self,
        model: &str,
        worker: &str,
        agents: &dyn AgentLoads,
    ) -> Option<Arc<LoadCell>> {
        self.load_cell
            .cell(agents.cell_generation(), || agents.load_cell(model, worker))
    }

    /// Whether it is draining (see [`Load::start_draining`]).
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Takes it out of rotation for removal: routing skips it from now on,
    /// requests in flight finish. Returns false when it already was.
    pub(crate) fn start_draining(&self) -> bool {
        let started = !self.draining.swap(true, Ordering::AcqRel);
        self.changed();
        started
    }

    /// Returns once no request is in flight here (at once when none is).
    pub(crate) async fn wait_idle(&self) {
        loop {
            // Registered before the check, so a guard dropped between the
            // check and the wait still wakes it.
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Requests this router has in flight here.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Predicted prefill blocks of routed requests still waiting for a first byte.
    pub(crate) fn pending_prefill_blocks(&self) -> u64 {
        self.pending_prefill.load(Ordering::Relaxed)
    }

    /// Counts a request in flight with `prefill_blocks` predicted uncached blocks.
    pub(super) fn begin(&self, prefill_blocks: u64) {
        let n = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.pending_prefill
            .fetch_add(prefill_blocks, Ordering::Relaxed);
        self.changed();
        self.gauge(n);
    }

    /// A request's first byte came: its `prefill_blocks` (> 0) are done.
    pub(super) fn prefilled(&self, prefill_blocks: u64) {
        self.pending_prefill
            .fetch_sub(prefill_blocks, Ordering::Relaxed);
        self.changed();
    }

    /// A request ended; returns how many are still in flight.
    pub(super) fn end(&self) -> u32 {
        let n = self.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        self.changed();
        self.gauge(n);
        n
    }

    /// Wakes [`Load::wait_idle`] when `in_flight` (what [`Load::end`]
    /// returned) is 0 and the backend is draining.
    pub(super) fn ended(&self, in_flight: u32) {
        if in_flight == 0 && self.is_draining() {
            self.idle.notify_waiters();
        }
    }

    /// The backend left its pool: its in-flight gauge reads 0.
    pub(super) fn retire(&self) {
        self.in_flight_gauge.set(0.0);
    }

    fn gauge(&self, n: u32) {
        self.in_flight_gauge.set(f64::from(n));
    }
}
