//! The grace a member gone from its provider's answer gets before it is
//! drained and removed.
//!
//! One answer without a member says little: a DNS server that returns a
//! subset, a pod failing one readiness probe, an EndpointSlice rewritten.
//! Draining at once dropped the member's index entries and the policy's
//! placements on it, and a pod back a second later started cold. So:
//! - gone from an answer, a member is taken out of rotation at once (a pod
//!   that fails readiness should get no new requests), but stays a member:
//!   its index entries, its index slot and its placements are kept;
//! - back in an answer within [`super::vanished::GRACE_ROUNDS`] of its provider's intervals
//!   (2.5 `health.probe_interval_ms` for `dns`, 5 for `kubernetes`), it is back in
//!   rotation at once, with all of that;
//! - still gone after, it is drained and removed as before.
//!
//! The last member in rotation is never taken out (as before).

use super::provider::Provider;
use crate::control::state::Shared;
use crate::routing::backend::Backend;
use crate::routing::pool::Pool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a member that vanished from its provider's answer may finish
/// its requests, once its grace is over, before it is removed.
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

/// `b`, one of `p`'s members, is in the answer again: if it waits out its
/// grace, it is back in rotation now. Returns whether that changed it.
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

/// `b`, one of `p`'s members, is missing from the answer at `now`.
/// Returns whether that changed it.
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
    match verdict(since.map(|t| now.saturating_duration_since(t)), grace) {
        Verdict::Wait => false,
        Verdict::SetAside => match crate::control::members::set_aside(s, pool, b.endpoint.id()) {
            Ok(_) => {
                p.vanished.mark(b, now);
                tracing::info!(pool = %pool.model, provider = %p.name, backend = %b.endpoint.id(),
                    grace_ms = grace.as_millis() as u64,
                    "backend gone from the answer: out of rotation, index kept until the grace ends");
                true
            }
            Err(e) => {
                tracing::warn!(pool = %pool.model, provider = %p.name, backend = %b.endpoint.id(), error = %e, "backend gone from the answer kept");
                false
            }
        },
        Verdict::Drain => {
            p.vanished.forget(b.endpoint.id());
            match crate::control::members::drain(s, pool, b.endpoint.id(), DRAIN_VANISHED) {
                Ok(_) => {
                    tracing::info!(pool = %pool.model, provider = %p.name, backend = %b.endpoint.id(), "backend gone from the answer past its grace: draining");
                    true
                }
                Err(e) => {
                    tracing::warn!(pool = %pool.model, provider = %p.name, backend = %b.endpoint.id(), error = %e, "backend gone from the answer kept");
                    false
                }
            }
        }
    }
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
