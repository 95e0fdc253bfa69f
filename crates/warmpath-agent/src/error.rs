//! The agent's error: why it could not start.

use thiserror::Error;

/// Why the agent could not start (a setting, or `--listen` cannot bind);
/// not worth retrying unchanged.
#[derive(Debug, Error)]
pub enum AgentError {
    /// A setting is invalid.
    #[error("invalid agent configuration: {0}")]
    Config(String),
}
