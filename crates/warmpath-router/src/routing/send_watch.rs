//! Cuts off a client that stops reading one answer after the send timeout, so
//! a stalled HTTP/2 stream cannot hold a backend slot while its connection lives.

use super::backend::FlightGuard;
use crate::control::metrics::Outcome;
use crate::http::clock::monotonic_ms;
use hyper::body::Incoming;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Not waiting for the client.
const NOT_WAITING: u64 = u64::MAX;

/// What an answer's body holds of its backend, shared with its watchdog.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) inner: Option<Incoming>,
    /// The request's flight on the backend.
    pub(crate) guard: Option<FlightGuard>,
}

/// The body's side of the watchdog: when it handed a frame over, when asked.
#[derive(Debug)]
pub(crate) struct SendWatch {
    waiting_since: Arc<AtomicU64>,
    // Dropped with the body: the watchdog ends.
    _stop: DropGuard,
}

impl SendWatch {
    /// Watches `held` for `limit`; `what` names the backend in the log.
    pub(crate) fn start(held: &Arc<Mutex<Held>>, limit: Duration, what: String) -> Self {
        let waiting_since = Arc::new(AtomicU64::new(NOT_WAITING));
        let stop = CancellationToken::new();
        tokio::spawn(watch(
            Arc::downgrade(held),
            Arc::clone(&waiting_since),
            limit,
            stop.clone(),
            what,
        ));
        SendWatch {
            waiting_since,
            _stop: stop.drop_guard(),
        }
    }

    /// The body is being polled.
    pub(crate) fn asked(&self) {
        self.waiting_since.store(NOT_WAITING, Ordering::Relaxed);
    }

    /// The body handed a frame over: the next one waits for the client.
    pub(crate) fn handed(&self) {
        self.waiting_since.store(monotonic_ms(), Ordering::Relaxed);
    }
}

/// Lets the backend go once the client waited past `limit`.
async fn watch(
    held: Weak<Mutex<Held>>,
    waiting_since: Arc<AtomicU64>,
    limit: Duration,
    stop: CancellationToken,
    what: String,
) {
    let limit_ms = limit.as_millis() as u64;
    loop {
        let since = waiting_since.load(Ordering::Relaxed);
        let wait = match since {
            NOT_WAITING => limit,
            t => Duration::from_millis((t + limit_ms).saturating_sub(monotonic_ms())),
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let since = waiting_since.load(Ordering::Relaxed);
        if since == NOT_WAITING || monotonic_ms() < since.saturating_add(limit_ms) {
            continue;
        }
        let Some(held) = held.upgrade() else {
            return;
        };
        let (inner, guard) = {
            let mut h = held.lock();
            (h.inner.take(), h.guard.take())
        };
        if let Some(mut g) = guard {
            g.outcome(Outcome::Cancelled);
        }
        drop(inner);
        metrics::counter!("warmpath_send_timeouts_total").increment(1);
        tracing::warn!(backend = %what, limit_ms,
            "the client read nothing of its answer in time: the backend's answer and slot are let go");
        return;
    }
}
