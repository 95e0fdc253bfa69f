//! Why the configuration was refused.

use std::path::PathBuf;
use thiserror::Error;

/// Why the configuration was refused. Never retryable: fix the file or flags.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {} is invalid: {source}", path.display())]
    Parse {
        path: PathBuf,
        /// The YAML error (with line and column).
        #[source]
        source: yaml_serde::Error,
    },
    /// A setting is out of range or inconsistent; `at` says where.
    #[error("invalid configuration at {at}: {reason}")]
    Invalid { at: String, reason: String },
}

pub(crate) fn invalid(at: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        at: at.into(),
        reason: reason.into(),
    }
}
