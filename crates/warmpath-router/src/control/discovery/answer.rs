//! What a provider answers: a worker id → URL set, or why there is none.

use std::collections::BTreeMap;
use thiserror::Error;

/// Why a provider produced no answer this round; the last set stays.
#[derive(Debug, Error)]
pub(crate) enum DiscoveryError {
    /// The resolver cannot be set up (system configuration unreadable). Retried every interval.
    #[error("cannot set up the resolver: {0}")]
    Setup(String),
    /// The lookup failed, timed out or found nothing. Retried every interval.
    #[error("lookup failed: {0}")]
    Lookup(String),
    /// A Kubernetes list or watch failed; it re-connects after a backoff.
    #[cfg(feature = "kubernetes")]
    #[error("watch failed: {0}")]
    Watch(String),
}

/// One answer: worker id → URL (the same for `dns`).
pub(crate) type Answer = BTreeMap<String, String>;
