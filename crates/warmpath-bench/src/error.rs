//! The one error type of the bench library.

use thiserror::Error;

/// Where the bench failed.
#[derive(Debug, Error)]
pub enum BenchError {
    /// A setting or argument is out of range. Fix the input; not retryable.
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A line of a JSONL trace is malformed (line 0: the whole trace).
    #[error("trace {origin}, line {line}: {reason}")]
    Trace {
        origin: String,
        /// 1-based line number.
        line: usize,
        reason: String,
    },
    #[error("policy: {0}")]
    Policy(#[from] warmpath_core::PolicyError),
    #[error("index: {0}")]
    Index(#[from] warmpath_core::IndexError),
    #[error("prefix cache: {0}")]
    PrefixCache(#[from] warmpath_core::prefix_cache::PrefixCacheError),
    #[error("tokenizer: {0}")]
    Tokenize(#[from] warmpath_core::tokenize::TokenizeError),
    /// A part of the fleet (engine, agent, router) failed to start, died or
    /// answered HTTP with an error.
    #[error("{what} failed: {reason}")]
    Component { what: String, reason: String },
}

/// `Ok` when `ok`, else [`BenchError::Invalid`].
pub(crate) fn ensure(ok: bool, what: &'static str, reason: &str) -> Result<(), BenchError> {
    match ok {
        true => Ok(()),
        false => Err(BenchError::Invalid {
            what,
            reason: reason.to_owned(),
        }),
    }
}

/// `Ok` when `v` is in `1..=hi`, else [`BenchError::Invalid`] saying so.
pub(crate) fn ensure_in(what: &'static str, v: usize, hi: usize) -> Result<(), BenchError> {
    ensure((1..=hi).contains(&v), what, &format!("must be in 1..={hi}"))
}

/// A [`BenchError::Component`].
pub(crate) fn component(what: impl Into<String>, reason: impl std::fmt::Display) -> BenchError {
    BenchError::Component {
        what: what.into(),
        reason: reason.to_string(),
    }
}

/// An I/O error on `path`.
pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> BenchError {
    let path = path.display().to_string();
    move |source| BenchError::Io { path, source }
}
