//! What can go wrong building a policy or picking with it.

use thiserror::Error;

/// Errors of policy configuration and picking.
#[derive(Debug, Error, PartialEq)]
pub enum PolicyError {
    /// No eligible backend (all unhealthy, or none serves the model/adapter);
    /// retryable once a backend recovers.
    #[error("no healthy backend is available")]
    NoBackend,
    /// A strategy name that does not exist.
    #[error(
        "unknown strategy {0:?}; expected random, least_outstanding, prefix_aware or kv_aware"
    )]
    UnknownStrategy(String),
    /// A configuration value out of range.
    #[error("invalid policy setting {name}: {reason}")]
    Invalid { name: &'static str, reason: String },
    /// A setting that no longer exists: refused rather than ignored.
    #[error("policy setting {name} was removed; {instead}")]
    Removed {
        name: &'static str,
        instead: &'static str,
    },
}
