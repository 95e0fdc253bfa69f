//! A backend's health: ejected or not, and its latest probe's verdict. A change
//! of ejection returns true, so [`super::Backend`] counts it as a load change.

use crate::control::metrics::Outcome;
use crate::http::clock::monotonic_ms;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Failure counts, probe verdict, ejection and back-off of one backend.
#[derive(Debug)]
pub(crate) struct Health {
    healthy_gauge: metrics::Gauge,
    consecutive_failures: AtomicU32,
    probe_failures: AtomicU32,
    probe_ok: AtomicBool,
    ejections_total: metrics::Counter,
    outcomes: [metrics::Counter; 6],
    ejected: AtomicBool,
    /// Ejections not forgiven by a success streak: the back-off's exponent.
    ejections: AtomicU32,
    /// Answers below 500 since the backend last came back.
    streak: AtomicU32,
    /// [`crate::http::clock::monotonic_ms`] of the last ejection.
    ejected_at_ms: AtomicU64,
}

impl Health {
    /// The health of backend `id` of pool `model`: in rotation, unverified.
    pub(crate) fn new(model: &str, id: &str) -> Self {
        Health {
            healthy_gauge: metrics::gauge!("warmpath_backend_healthy", "pool" => model.to_owned(), "backend" => id.to_owned()),
            ejections_total: metrics::counter!("warmpath_backend_ejections_total", "pool" => model.to_owned(), "backend" => id.to_owned()),
            outcomes: Outcome::LABELS.map(|o| {
                metrics::counter!("warmpath_backend_requests_total", "pool" => model.to_owned(),
                    "backend" => id.to_owned(), "outcome" => o)
            }),
            consecutive_failures: AtomicU32::new(0),
            probe_failures: AtomicU32::new(0),
            // Unverified until the first probe: readiness waits for it.
            probe_ok: AtomicBool::new(false),
            ejected: AtomicBool::new(false),
            ejections: AtomicU32::new(0),
            streak: AtomicU32::new(0),
            ejected_at_ms: AtomicU64::new(0),
        }
    }

    /// Whether requests may be sent here (not ejected).
    pub(crate) fn is_healthy(&self) -> bool {
        !self.ejected.load(Ordering::Relaxed)
    }

    /// Whether its last probe passed and it is not ejected (readiness).
    pub(crate) fn is_verified(&self) -> bool {
        self.is_healthy() && self.probe_ok.load(Ordering::Relaxed)
    }

    /// Records a failed request (or active `probe`), ejecting only if `room()`
    /// allows; true when it ejected.
    pub(super) fn failed_within(
        &self,
        probe: bool,
        eject_after: u32,
        room: impl FnOnce() -> bool,
    ) -> bool {
        let count = if probe {
            self.probe_ok.store(false, Ordering::Relaxed);
            &self.probe_failures
        } else {
            &self.consecutive_failures
        };
        let n = count.fetch_add(1, Ordering::Relaxed) + 1;
        let ejected = n >= eject_after && self.is_healthy() && room() && self.eject(eject_after);
        self.update_gauge();
        ejected
    }

    /// Records an answer below 500.
    pub(crate) fn succeeded(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        if self.ejections.load(Ordering::Relaxed) > 0 {
            self.streak.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a passing probe; true when this brought the backend back.
    /// Only a `serving` probe (generation) forgives failed requests.
    pub(super) fn probe_passed(&self, serving: bool) -> bool {
        self.probe_failures.store(0, Ordering::Relaxed);
        self.probe_ok.store(true, Ordering::Relaxed);
        let back = self.ejected.swap(false, Ordering::Relaxed);
        if back || serving {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
        if back {
            self.streak.store(0, Ordering::Relaxed);
        }
        self.update_gauge();
        back
    }

    /// When the back-off ends: `base_ms` doubled per unforgiven ejection, at most `max_ms`.
    pub(crate) fn readmit_at_ms(&self, base_ms: u64, max_ms: u64) -> u64 {
        let doublings = self.ejections.load(Ordering::Relaxed).saturating_sub(1);
        let backoff = base_ms
            .saturating_mul(1u64 << doublings.min(32))
            .min(max_ms);
        self.ejected_at_ms
            .load(Ordering::Relaxed)
            .saturating_add(backoff)
    }

    /// Counts how a request ended (`warmpath_backend_requests_total`).
    pub(super) fn count(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].increment(1);
    }

    /// The backend left its pool: its health gauge reads 0.
    pub(super) fn retire(&self) {
        self.healthy_gauge.set(0.0);
    }

    /// Ejects (once); a success streak of `eject_after` resets the back-off.
    fn eject(&self, eject_after: u32) -> bool {
        if self.ejected.swap(true, Ordering::Relaxed) {
            return false;
        }
        if self.streak.swap(0, Ordering::Relaxed) >= eject_after {
            self.ejections.store(1, Ordering::Relaxed);
        } else {
            self.ejections.fetch_add(1, Ordering::Relaxed);
        }
        self.ejected_at_ms.store(monotonic_ms(), Ordering::Relaxed);
        self.ejections_total.increment(1);
        self.update_gauge();
        true
    }

    fn update_gauge(&self) {
        self.healthy_gauge
            .set(if self.is_verified() { 1.0 } else { 0.0 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Health {
        Health::new("m", "w")
    }

    fn failed(h: &Health, eject_after: u32) -> bool {
        h.failed_within(false, eject_after, || true)
    }

    fn probe_failed(h: &Health, eject_after: u32) -> bool {
        h.failed_within(true, eject_after, || true)
    }

    #[test]
    fn ejection_after_n_failures_and_probe_recovery() {
        let h = health();
        assert!(!failed(&h, 3));
        assert!(!failed(&h, 3));
        assert!(failed(&h, 3), "third failure ejects");
        assert!(!failed(&h, 3), "already ejected");
        assert!(!h.is_healthy());
        assert!(h.probe_passed(false));
        assert!(h.is_healthy() && h.is_verified());
        assert!(!failed(&h, 3), "counter was reset");
    }

    #[test]
    fn no_room_no_ejection() {
        let h = health();
        assert!(
            !h.failed_within(false, 1, || false),
            "the pool may not lose it"
        );
        assert!(h.is_healthy());
        assert!(h.failed_within(false, 1, || true));
    }

    #[test]
    fn a_health_probe_does_not_forgive_failed_requests() {
        let h = health();
        assert!(!failed(&h, 2));
        assert!(!h.probe_passed(false));
        assert!(failed(&h, 2), "still two in a row");
        assert!(h.probe_passed(false));
        assert!(!failed(&h, 2));
        assert!(!h.probe_passed(true), "already in");
        assert!(!failed(&h, 2), "a completion probe forgives");
    }

    #[test]
    fn probes_verify_and_eject() {
        let h = health();
        assert!(!h.is_verified(), "unverified until probed");
        assert!(!h.probe_passed(false));
        assert!(h.is_verified());
        assert!(!probe_failed(&h, 2));
        assert!(
            h.is_healthy() && !h.is_verified(),
            "still routed, not verified"
        );
        assert!(probe_failed(&h, 2), "second failed probe ejects");
        assert!(!h.is_healthy());
    }

    #[test]
    fn back_off_doubles_to_the_cap_and_a_streak_resets_it() {
        let h = health();
        let backoff =
            |h: &Health| h.readmit_at_ms(100, 350) - h.ejected_at_ms.load(Ordering::Relaxed);
        assert!(failed(&h, 1));
        assert_eq!(backoff(&h), 100);
        for want in [200, 350, 350] {
            h.probe_passed(false);
            h.succeeded(); // one success: short of the streak of eject_after (2)
            assert!(failed(&h, 2) || failed(&h, 2));
            assert_eq!(backoff(&h), want);
        }
        h.probe_passed(false);
        h.succeeded();
        h.succeeded();
        assert!(!failed(&h, 2));
        assert!(failed(&h, 2));
        assert_eq!(backoff(&h), 100, "forgiven after a streak of eject_after");
    }
}
