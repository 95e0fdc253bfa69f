//! One backend engine as the router sees it: address, index slot, the load
//! this router put on it, its health, and the LoRA adapters it serves.
//!
//! Load accounting is RAII: [`Backend::begin`] counts a request in flight
//! (and its predicted prefill blocks) and the returned [`FlightGuard`] undoes
//! it — the prefill part at the first upstream byte
//! ([`FlightGuard::first_byte`]), the in-flight part when the response body
//! ends or is dropped (client gone, upstream failed).
//!
//! Health is two facts: whether the backend is *ejected* (no requests are
//! routed to it) and the verdict of its latest active probe. Ejection comes
//! from `eject_after` consecutive failures of proxied requests or of probes;
//! it lasts a back-off that doubles with each ejection not preceded by a
//! success streak ([`Backend::readmit_at_ms`]).
//!
//! Membership (`crate::control::members`) adds one more fact: a *draining* backend
//! gets no new requests; [`Backend::wait_idle`] returns once its last
//! request in flight has ended, and it is then removed.

use crate::config::{BackendConfig, BackendUrl};
use crate::control::metrics::Outcome;
use crate::routing::load_cell::CellCache;
use axum::http::{HeaderMap, HeaderValue};
use parking_lot::RwLock;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;
use warmpath_core::WorkerSlot;

/// Where a member came from: a reload only adds and removes `Config`
/// members, a discovery provider only its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The configuration file or flags.
    Config,
    /// `POST /admin/pools/{model}/backends`.
    Admin,
    /// A discovery provider (its name, e.g. `dns:engines.svc`).
    Discovery(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Config => f.write_str("config"),
            Origin::Admin => f.write_str("admin"),
            Origin::Discovery(name) => f.write_str(name),
        }
    }
}

/// Live state of one backend.
pub(crate) struct Backend {
    /// Worker id (the agent's id; `x-warmpath-backend`).
    pub id: String,
    /// Base URL.
    pub url: BackendUrl,
    /// Slot in the pool's cache index.
    pub slot: WorkerSlot,
    /// Who added it.
    pub origin: Origin,
    /// The config it was added with (a reload compares url and adapters).
    pub configured: BackendConfig,
    /// `warmpath_backend_in_flight` of this backend.
    in_flight_gauge: metrics::Gauge,
    in_flight: AtomicU32,
    pending_prefill: AtomicU64,
    /// `warmpath_backend_healthy` of this backend.
    healthy_gauge: metrics::Gauge,
    consecutive_failures: AtomicU32,
    probe_failures: AtomicU32,
    probe_ok: AtomicBool,
    /// `warmpath_backend_ejections_total{pool, backend}`.
    ejections_total: metrics::Counter,
    /// `warmpath_backend_requests_total{pool, backend, outcome}`.
    outcomes: [metrics::Counter; 6],
    ejected: AtomicBool,
    /// Ejections not forgiven by a success streak: the back-off's exponent.
    ejections: AtomicU32,
    /// Answers below 500 since the backend last came back.
    streak: AtomicU32,
    /// [`crate::routing::load_cell::monotonic_ms`] of the last ejection.
    ejected_at_ms: AtomicU64,
    learned_adapters: RwLock<BTreeSet<String>>,
    /// The engine's own model cards of this pool ([`crate::api::models`]).
    learned_cards: RwLock<Vec<serde_json::Value>>,
    /// Taken out of rotation for removal (no new requests).
    draining: AtomicBool,
    /// Woken when a draining backend's last request ends.
    idle: Notify,
    /// Its own `api_key` as an `Authorization` value.
    auth: Option<HeaderValue>,
    /// Whether a probe answered 401/403 was logged (once a backend).
    warned_credentials: AtomicBool,
    /// Its worker's reported engine load, found once per registry
    /// generation ([`crate::routing::load_cell`]).
    load_cell: CellCache,
    /// Bumped after every change of what routing reads here (in flight,
    /// pending prefill, ejected, draining): the load board re-reads only
    /// backends whose count moved ([`crate::routing::load_board`]).
    changes: AtomicU64,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("slot", &self.slot)
            .field("in_flight", &self.in_flight)
            .field("pending_prefill", &self.pending_prefill)
            .field("ejected", &self.ejected)
            .field("probe_ok", &self.probe_ok)
            .field("ejections", &self.ejections)
            .field("draining", &self.draining)
            .finish_non_exhaustive()
    }
}

impl Backend {
    /// A backend from its (validated) config.
    pub(crate) fn new(
        model: &str,
        cfg: &BackendConfig,
        url: BackendUrl,
        slot: WorkerSlot,
        origin: Origin,
    ) -> Self {
        Backend {
            id: cfg.id().to_owned(),
            url,
            slot,
            origin,
            configured: cfg.clone(),
            auth: cfg.api_key.as_ref().and_then(|k| k.bearer()),
            warned_credentials: AtomicBool::new(false),
            in_flight_gauge: crate::control::metrics::backend_in_flight(model, cfg.id()),
            in_flight: AtomicU32::new(0),
            pending_prefill: AtomicU64::new(0),
            healthy_gauge: crate::control::metrics::backend_healthy(model, cfg.id()),
            ejections_total: crate::control::metrics::backend_ejections(model, cfg.id()),
            outcomes: crate::control::metrics::backend_requests(model, cfg.id()),
            consecutive_failures: AtomicU32::new(0),
            probe_failures: AtomicU32::new(0),
            // Unverified until the first probe: readiness waits for it.
            probe_ok: AtomicBool::new(false),
            ejected: AtomicBool::new(false),
            ejections: AtomicU32::new(0),
            streak: AtomicU32::new(0),
            ejected_at_ms: AtomicU64::new(0),
            learned_adapters: RwLock::new(BTreeSet::new()),
            learned_cards: RwLock::new(Vec::new()),
            draining: AtomicBool::new(false),
            idle: Notify::new(),
            load_cell: CellCache::default(),
            changes: AtomicU64::new(0),
        }
    }

    /// How many times what routing reads here changed (see `changes`);
    /// read before the values, so a change racing the read shows next time.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Counts a change of what routing reads, after it is made.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// The engine load its agent reported, if recent (`agents` of pool
    /// `model`, read through the cached cell: no lookup per request).
    pub(crate) fn engine_load(
        &self,
        model: &str,
        agents: &dyn crate::routing::loads::AgentLoads,
        now_ms: u64,
    ) -> Option<warmpath_core::EngineLoad> {
        self.load_cell
            .read(
                agents.cell_generation(),
                || agents.load_cell(model, &self.id),
                |c| c.fresh(now_ms),
            )
            .flatten()
    }

    /// Its worker's load cell in `agents`' current generation (what
    /// [`Backend::engine_load`] reads), for the load board to keep.
    pub(crate) fn load_cell(
        &self,
        model: &str,
        agents: &dyn crate::routing::loads::AgentLoads,
    ) -> Option<std::sync::Arc<crate::routing::load_cell::LoadCell>> {
        self.load_cell.cell(agents.cell_generation(), || {
            agents.load_cell(model, &self.id)
        })
    }

    /// Whether it is draining (see [`Backend::start_draining`]).
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

    /// Marks the backend gone from its pool: its health gauge reads 0.
    pub(crate) fn retire(&self) {
        self.healthy_gauge.set(0.0);
        self.in_flight_gauge.set(0.0);
    }

    /// Requests this router has in flight here.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Predicted prefill blocks of routed requests still waiting for a first byte.
    pub(crate) fn pending_prefill_blocks(&self) -> u64 {
        self.pending_prefill.load(Ordering::Relaxed)
    }

    /// Whether requests may be sent here (not ejected).
    pub(crate) fn is_healthy(&self) -> bool {
        !self.ejected.load(Ordering::Relaxed)
    }

    /// Whether this backend serves `adapter` (learned from its `/v1/models`).
    pub(crate) fn serves_adapter(&self, adapter: &str) -> bool {
        self.learned_adapters.read().contains(adapter)
    }

    /// Every adapter served.
    pub(crate) fn adapters(&self) -> BTreeSet<String> {
        self.learned_adapters.read().clone()
    }

    /// Replaces the adapters learned from the backend's `/v1/models`.
    pub(crate) fn set_learned_adapters(&self, adapters: BTreeSet<String>) {
        *self.learned_adapters.write() = adapters;
    }

    /// The engine's model cards of this pool, as its `/v1/models` last gave them.
    pub(crate) fn learned_cards(&self) -> Vec<serde_json::Value> {
        self.learned_cards.read().clone()
    }

    /// Replaces the model cards learned from the backend's `/v1/models`.
    pub(crate) fn set_learned_cards(&self, cards: Vec<serde_json::Value>) {
        *self.learned_cards.write() = cards;
    }

    /// Whether an active probe vouched for it last time and it is not
    /// ejected: what readiness and `warmpath_backend_healthy` report.
    pub(crate) fn is_verified(&self) -> bool {
        self.is_healthy() && self.probe_ok.load(Ordering::Relaxed)
    }

    /// Records a failure (a refused connect, a 5xx answer, an exchange that
    /// broke after it was sent); returns true when this ejected the backend.
    #[cfg(test)]
    pub(crate) fn failed(&self, eject_after: u32) -> bool {
        self.failed_within(eject_after, || true)
    }

    /// [`Backend::failed`], ejecting only if `room()` says the pool may
    /// lose another member (`health.max_ejection_percent`).
    pub(crate) fn failed_within(&self, eject_after: u32, room: impl FnOnce() -> bool) -> bool {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        n >= eject_after && self.is_healthy() && room() && self.eject(eject_after)
    }

    /// Whether the engine's demand for credentials was already logged
    /// (and marks it logged).
    pub(crate) fn warned_credentials(&self) -> bool {
        self.warned_credentials.swap(true, Ordering::Relaxed)
    }

    /// Sets the `Authorization` of a request to this backend: its own key,
    /// else `upstream` (`upstream.api_key`); with neither, `headers` keep
    /// the client's.
    pub(crate) fn authorize(&self, headers: &mut HeaderMap, upstream: Option<&HeaderValue>) {
        if let Some(v) = self.auth.as_ref().or(upstream) {
            headers.insert(axum::http::header::AUTHORIZATION, v.clone());
        }
    }

    /// Records an answer below 500 (the failure count resets, the streak
    /// that forgives past ejections grows).
    pub(crate) fn succeeded(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        if self.ejections.load(Ordering::Relaxed) > 0 {
            self.streak.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a failed active probe; returns true when this ejected the
    /// backend (`eject_after` failed probes in a row).
    #[cfg(test)]
    pub(crate) fn probe_failed(&self, eject_after: u32) -> bool {
        self.probe_failed_within(eject_after, || true)
    }

    /// [`Backend::probe_failed`], ejecting only if `room()` allows it.
    pub(crate) fn probe_failed_within(
        &self,
        eject_after: u32,
        room: impl FnOnce() -> bool,
    ) -> bool {
        self.probe_ok.store(false, Ordering::Relaxed);
        let n = self.probe_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let ejected = n >= eject_after && self.is_healthy() && room() && self.eject(eject_after);
        self.update_gauge();
        ejected
    }

    /// Records a passing active probe; returns true when this brought the
    /// backend back. `serving`: the probe exercised generation, so it also
    /// forgives failed requests (a `/health` answer does not: an engine can
    /// answer it while every completion fails).
    pub(crate) fn probe_passed(&self, serving: bool) -> bool {
        self.probe_failures.store(0, Ordering::Relaxed);
        self.probe_ok.store(true, Ordering::Relaxed);
        let back = self.ejected.swap(false, Ordering::Relaxed);
        if back {
            self.changed();
        }
        if back || serving {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
        if back {
            self.streak.store(0, Ordering::Relaxed);
        }
        self.update_gauge();
        back
    }

    /// When (on [`crate::routing::load_cell::monotonic_ms`]'s clock) an ejected backend's
    /// back-off ends: `base_ms` doubled for each unforgiven ejection after
    /// the first, at most `max_ms`.
    pub(crate) fn readmit_at_ms(&self, base_ms: u64, max_ms: u64) -> u64 {
        let doublings = self.ejections.load(Ordering::Relaxed).saturating_sub(1);
        let backoff = base_ms
            .saturating_mul(1u64 << doublings.min(32))
            .min(max_ms);
        self.ejected_at_ms
            .load(Ordering::Relaxed)
            .saturating_add(backoff)
    }

    /// Ejects (once); a backend that answered `eject_after` requests since it
    /// last came back starts its back-off from the base again.
    fn eject(&self, eject_after: u32) -> bool {
        if self.ejected.swap(true, Ordering::Relaxed) {
            return false;
        }
        self.changed();
        if self.streak.swap(0, Ordering::Relaxed) >= eject_after {
            self.ejections.store(1, Ordering::Relaxed);
        } else {
            self.ejections.fetch_add(1, Ordering::Relaxed);
        }
        self.ejected_at_ms
            .store(crate::routing::load_cell::monotonic_ms(), Ordering::Relaxed);
        self.ejections_total.increment(1);
        self.update_gauge();
        true
    }

    fn update_gauge(&self) {
        self.healthy_gauge
            .set(if self.is_verified() { 1.0 } else { 0.0 });
    }

    /// Counts a request in flight with `prefill_blocks` predicted uncached blocks.
    pub(crate) fn begin(self: &Arc<Self>, prefill_blocks: u64) -> FlightGuard {
        let n = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.pending_prefill
            .fetch_add(prefill_blocks, Ordering::Relaxed);
        self.changed();
        self.gauge(n);
        FlightGuard {
            backend: Arc::clone(self),
            prefill_blocks,
            outcome: Outcome::Cancelled,
            share: None,
        }
    }

    fn gauge(&self, n: u32) {
        self.in_flight_gauge.set(f64::from(n));
    }
}

/// One request in flight on a backend; dropping it ends the request and
/// counts its [`Outcome`] (`cancelled` unless [`FlightGuard::outcome`] said
/// otherwise).
#[derive(Debug)]
pub(crate) struct FlightGuard {
    backend: Arc<Backend>,
    prefill_blocks: u64,
    outcome: Outcome,
    /// The same request as told to the other router replicas.
    share: Option<Box<dyn crate::routing::share::SharedRequest>>,
}

impl FlightGuard {
    /// The backend.
    pub(crate) fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// The first upstream byte arrived: prefill is done, stop counting its blocks.
    pub(crate) fn first_byte(&mut self) {
        if let Some(s) = &mut self.share {
            s.prefilled();
        }
        let n = std::mem::take(&mut self.prefill_blocks);
        if n > 0 {
            self.backend.pending_prefill.fetch_sub(n, Ordering::Relaxed);
            self.backend.changed();
        }
    }

    /// Tells the other router replicas its phases too (module `share`).
    pub(crate) fn share(&mut self, share: Option<Box<dyn crate::routing::share::SharedRequest>>) {
        self.share = share;
    }

    /// How the request ended, counted when the guard drops.
    pub(crate) fn outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        self.first_byte();
        let n = self.backend.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        self.backend.changed();
        self.backend.gauge(n);
        self.backend.outcomes[self.outcome as usize].increment(1);
        if n == 0 && self.backend.is_draining() {
            self.backend.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn backend() -> Arc<Backend> {
        let cfg = BackendConfig {
            url: "http://127.0.0.1:1".into(),
            worker_id: Some("w".into()),
            api_key: None,
        };
        Arc::new(Backend::new(
            "m",
            &cfg,
            BackendUrl::parse(&cfg.url).unwrap(),
            0,
            Origin::Config,
        ))
    }

    #[test]
    fn guards_count_and_uncount() {
        let b = backend();
        let mut g1 = b.begin(10);
        let g2 = b.begin(5);
        assert_eq!((b.in_flight(), b.pending_prefill_blocks()), (2, 15));
        g1.first_byte();
        g1.first_byte();
        assert_eq!((b.in_flight(), b.pending_prefill_blocks()), (2, 5));
        drop(g2);
        assert_eq!((b.in_flight(), b.pending_prefill_blocks()), (1, 0));
        drop(g1);
        assert_eq!((b.in_flight(), b.pending_prefill_blocks()), (0, 0));
    }

    #[test]
    fn ejection_after_n_failures_and_probe_recovery() {
        let b = backend();
        assert!(!b.failed(3));
        assert!(!b.failed(3));
        assert!(b.failed(3), "third failure ejects");
        assert!(!b.failed(3), "already ejected");
        assert!(!b.is_healthy());
        assert!(b.probe_passed(false));
        assert!(b.is_healthy() && b.is_verified());
        assert!(!b.failed(3), "counter was reset");
    }

    #[test]
    fn a_health_probe_does_not_forgive_failed_requests() {
        let b = backend();
        assert!(!b.failed(2));
        assert!(!b.probe_passed(false));
        assert!(b.failed(2), "still two in a row");
        assert!(b.probe_passed(false));
        assert!(!b.failed(2));
        assert!(!b.probe_passed(true), "already in");
        assert!(!b.failed(2), "a completion probe forgives");
    }

    #[test]
    fn probes_verify_and_eject() {
        let b = backend();
        assert!(!b.is_verified(), "unverified until probed");
        assert!(!b.probe_passed(false));
        assert!(b.is_verified());
        assert!(!b.probe_failed(2));
        assert!(
            b.is_healthy() && !b.is_verified(),
            "still routed, not verified"
        );
        assert!(b.probe_failed(2), "second failed probe ejects");
        assert!(!b.is_healthy());
    }

    #[test]
    fn back_off_doubles_to_the_cap_and_a_streak_resets_it() {
        let b = backend();
        let backoff =
            |b: &Backend| b.readmit_at_ms(100, 350) - b.ejected_at_ms.load(Ordering::Relaxed);
        assert!(b.failed(1));
        assert_eq!(backoff(&b), 100);
        for want in [200, 350, 350] {
            b.probe_passed(false);
            b.succeeded(); // one success: short of the streak of eject_after (2)
            assert!(b.failed(2) || b.failed(2));
            assert_eq!(backoff(&b), want);
        }
        b.probe_passed(false);
        b.succeeded();
        b.succeeded();
        assert!(!b.failed(2));
        assert!(b.failed(2));
        assert_eq!(backoff(&b), 100, "forgiven after a streak of eject_after");
    }

    #[tokio::test]
    async fn a_draining_backend_is_idle_once_its_last_request_ends() {
        let b = backend();
        let g = b.begin(0);
        assert!(b.start_draining());
        assert!(!b.start_draining(), "once");
        let waiter = tokio::spawn({
            let b = Arc::clone(&b);
            async move { b.wait_idle().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a request is still in flight");
        drop(g);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        b.wait_idle().await;
    }

    #[test]
    fn adapters_are_learned() {
        let b = backend();
        assert!(!b.serves_adapter("chat"));
        b.set_learned_adapters(["chat".to_owned()].into());
        assert!(b.serves_adapter("chat"));
        assert_eq!(b.adapters().len(), 1);
    }
}
