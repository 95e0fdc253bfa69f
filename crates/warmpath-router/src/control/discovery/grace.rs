//! The grace of a member gone from its provider's answer: out of rotation at
//! once, index kept, drained after [`super::vanished::GRACE_ROUNDS`] intervals.

use super::provider::Provider;
use crate::control::state::Shared;
use crate::routing::backend::Backend;
use crate::routing::pool::Pool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a vanished member may finish its requests after its grace.
const DRAIN_VANISHED: Duration = Duration::from_secs(120);

/// What happens to a member gone from the answer for `gone_for`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Just gone: out of rotation, kept.
    SetAside,
    /// Within its grace: nothing changes.
    Wait,
    /// Past its grace: drained and removed.
    Drain,
}

/// The verdict for a member gone for `gone_for` (`None`: not marked yet).
pub(crate) fn verdict(gone_for: Option<Duration>, grace: Duration) -> Verdict {
    match gone_for {
        None => Verdict::SetAside,
        Some(d) if d >= grace => Verdict::Drain,
        Some(_) => Verdict::Wait,
    }
}

/// `b`, one of `p`'s members, is in the answer again; whether that changed it.
pub(super) async fn returned(
    s: &Arc<Shared>,
    pool: &Arc<Pool>,
    p: &Provider,
    b: &Arc<Backend>,
) -> bool {
    if !p.vanished.take(b) || !b.load.is_draining() {
        return false;
    }
    match crate::control::members::restore(s, pool, b).await {
        Ok(_) => {
            tracing::info!(pool = %pool.model, provider = %p.name, backend = %b.endpoint.id(), "backend back in the answer within its grace: in rotation again, index kept");
            true
        }
        Err(e) => {
            tracing::warn!(pool = %pool.model, provider = %p.name, backend = %b.endpoint.id(), error = %e, "backend back in the answer not restored");
            false
        }
    }
}

/// `b`, one of `p`'s members, is missing from the answer; whether that changed it.
pub(super) fn missing(
    s: &Arc<Shared>,
    pool: &Arc<Pool>,
    p: &Provider,
    b: &Arc<Backend>,
    now: Instant,
) -> bool {
    let since = p.vanished.since_of(b);
    if since.is_none() && b.load.is_draining() {
        return false; // drained by someone else: that drain removes it
    }
    let grace = p.grace(s.config.health.probe_interval_ms);
    let id = b.endpoint.id();
    let (done, what) = match verdict(since.map(|t| now.saturating_duration_since(t)), grace) {
        Verdict::Wait => return false,
        Verdict::SetAside => {
            let set = crate::control::members::set_aside(s, pool, id);
            let what = "out of rotation, index kept until the grace ends";
            (set.map(|_| p.vanished.mark(b, now)), what)
        }
        Verdict::Drain => {
            p.vanished.forget(id);
            let drained = crate::control::members::drain(s, pool, id, DRAIN_VANISHED);
            (drained.map(|_| ()), "past its grace: draining")
        }
    };
    match &done {
        Ok(()) => tracing::info!(pool = %pool.model, provider = %p.name, backend = %id,
            grace_ms = grace.as_millis() as u64, "backend gone from the answer: {what}"),
        Err(e) => tracing::warn!(pool = %pool.model, provider = %p.name, backend = %id,
            error = %e, "backend gone from the answer kept"),
    }
    done.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vanished_member_waits_out_its_grace_before_its_drain() {
        let g = Duration::from_millis(600);
        assert_eq!(verdict(None, g), Verdict::SetAside);
        assert_eq!(verdict(Some(Duration::ZERO), g), Verdict::Wait);
        assert_eq!(verdict(Some(Duration::from_millis(599)), g), Verdict::Wait);
        assert_eq!(verdict(Some(g), g), Verdict::Drain);
    }
}
