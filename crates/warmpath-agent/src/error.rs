//! The agent's error: why it could not start.

use std::net::SocketAddr;
use thiserror::Error;

/// Why the agent could not start. None of these is worth retrying unchanged.
#[derive(Debug, Error)]
pub enum AgentError {
    /// A setting is invalid.
    #[error("invalid agent configuration: {0}")]
    Config(String),
    /// The HTTP listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}
