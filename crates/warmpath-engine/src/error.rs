//! The engine's one error type: where it failed and whether a retry can help.

use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The model folder's contents are unusable (bad config, missing weights).
    #[error("model file {path} is not usable: {reason}")]
    BadModel { path: PathBuf, reason: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A tensor operation failed (shape bug, device out of memory).
    #[error("tensor computation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// The request is unusable as sent (empty prompt, too long, bad token id).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The prefix cache refused (e.g. reset while requests run).
    #[error(transparent)]
    Cache(#[from] warmpath_core::prefix_cache::PrefixCacheError),
    /// The KV event publisher could not start (e.g. the endpoint is taken).
    #[error("kv events: {0}")]
    Events(String),
    /// This build or this machine cannot do what was asked (e.g. `cuda`
    /// without the `cuda` feature, an unknown dtype).
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("engine queue is full ({0} requests waiting); retry later")]
    Busy(usize),
    /// The worker thread has stopped (shutdown or a crash).
    #[error("engine worker has stopped")]
    WorkerGone,
}

impl EngineError {
    pub(crate) fn bad_model(path: &Path, reason: impl std::fmt::Display) -> Self {
        EngineError::BadModel {
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }

    /// Whether sending the same request again later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            EngineError::Busy(_)
                | EngineError::Cache(warmpath_core::prefix_cache::PrefixCacheError::InUse(_))
        )
    }

    /// Whether the client, not the engine, is at fault (HTTP 400).
    pub fn is_client_error(&self) -> bool {
        matches!(self, EngineError::BadRequest(_))
    }
}

/// The text of a model file.
pub(crate) fn read_text(path: &Path) -> Result<String, EngineError> {
    std::fs::read_to_string(path).map_err(|source| EngineError::Io {
        path: path.to_owned(),
        source,
    })
}

/// A model file's JSON; [`EngineError::BadModel`] naming the file when it does not parse.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, EngineError> {
    serde_json::from_str(&read_text(path)?).map_err(|e| EngineError::bad_model(path, e))
}
