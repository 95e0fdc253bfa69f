//! One backend engine: who it is ([`endpoint`]), its [`health`] and the
//! [`Load`] this router put on it; [`Backend::begin`]'s [`FlightGuard`] undoes a request's load.

pub(crate) mod endpoint;
pub(crate) mod health;

pub(crate) use endpoint::Origin;

use crate::config::{BackendConfig, BackendUrl};
use crate::control::metrics::Outcome;
use crate::routing::loads::{Load, Member};
use endpoint::Endpoint;
use health::Health;
use std::sync::Arc;
use warmpath_core::WorkerSlot;

#[derive(Debug)]
pub(crate) struct Backend {
    /// Identity, address, credentials, learned adapters and model cards.
    pub endpoint: Endpoint,
    pub health: Health,
    pub load: Load,
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
            endpoint: Endpoint::new(cfg, url, slot, origin),
            health: Health::new(model, cfg.id()),
            load: Load::new(model, cfg.id()),
        }
    }

    /// Marks the backend gone from its pool: its gauges read 0.
    pub(crate) fn retire(&self) {
        self.health.retire();
        self.load.retire();
    }

    /// Records a failure; true when this ejected the backend.
    #[cfg(test)]
    pub(crate) fn failed(&self, eject_after: u32) -> bool {
        self.failed_within(false, eject_after, || true)
    }

    /// Records a failed active probe; true when this ejected the backend.
    #[cfg(test)]
    pub(crate) fn probe_failed(&self, eject_after: u32) -> bool {
        self.failed_within(true, eject_after, || true)
    }

    /// [`Health::failed_within`]: a failed request (or `probe`), ejecting only if `room()` allows it.
    pub(crate) fn failed_within(
        &self,
        probe: bool,
        eject_after: u32,
        room: impl FnOnce() -> bool,
    ) -> bool {
        let ejected = self.health.failed_within(probe, eject_after, room);
        if ejected {
            self.load.changed();
        }
        ejected
    }

    /// See [`Health::probe_passed`].
    pub(crate) fn probe_passed(&self, serving: bool) -> bool {
        let back = self.health.probe_passed(serving);
        if back {
            self.load.changed();
        }
        back
    }

    /// Counts a request in flight with `prefill_blocks` predicted uncached blocks.
    pub(crate) fn begin(self: &Arc<Self>, prefill_blocks: u64) -> FlightGuard {
        self.load.begin(prefill_blocks);
        FlightGuard {
            backend: Arc::clone(self),
            prefill_blocks,
            outcome: Outcome::Cancelled,
            share: None,
        }
    }
}

impl Member for Backend {
    fn load(&self) -> &Load {
        &self.load
    }

    fn worker(&self) -> &str {
        self.endpoint.id()
    }

    fn healthy(&self) -> bool {
        self.health.is_healthy()
    }
}

/// One request in flight on a backend; dropping it ends it and counts its [`Outcome`].
#[derive(Debug)]
pub(crate) struct FlightGuard {
    pub(crate) backend: Arc<Backend>,
    prefill_blocks: u64,
    outcome: Outcome,
    /// The same request as told to the other router replicas.
    share: Option<Box<dyn crate::routing::share::SharedRequest>>,
}

impl FlightGuard {
    /// The first upstream byte arrived: prefill is done, stop counting its blocks.
    pub(crate) fn first_byte(&mut self) {
        if let Some(s) = &mut self.share {
            s.prefilled();
        }
        let n = std::mem::take(&mut self.prefill_blocks);
        if n > 0 {
            self.backend.load.prefilled(n);
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
        let n = self.backend.load.end();
        self.backend.health.count(self.outcome);
        self.backend.load.ended(n);
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
        let counts = |b: &Backend| (b.load.in_flight(), b.load.pending_prefill_blocks());
        assert_eq!(counts(&b), (2, 15));
        g1.first_byte();
        g1.first_byte();
        assert_eq!(counts(&b), (2, 5));
        drop(g2);
        assert_eq!(counts(&b), (1, 0));
        drop(g1);
        assert_eq!(counts(&b), (0, 0));
    }

    #[test]
    fn ejection_and_readmission_count_as_changes() {
        let b = backend();
        let before = b.load.changes();
        assert!(!b.failed(2));
        assert_eq!(b.load.changes(), before, "a failure short of ejecting");
        assert!(b.failed(2));
        assert_eq!(b.load.changes(), before + 1, "ejected");
        assert!(b.probe_passed(false));
        assert_eq!(b.load.changes(), before + 2, "back");
        assert!(!b.probe_passed(false));
        assert!(b.probe_failed(1));
        assert_eq!(b.load.changes(), before + 3, "ejected by a probe");
    }

    #[tokio::test]
    async fn a_draining_backend_is_idle_once_its_last_request_ends() {
        let b = backend();
        let g = b.begin(0);
        assert!(b.load.start_draining());
        assert!(!b.load.start_draining(), "once");
        let waiter = tokio::spawn({
            let b = Arc::clone(&b);
            async move { b.load.wait_idle().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a request is still in flight");
        drop(g);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        b.load.wait_idle().await;
    }
}
