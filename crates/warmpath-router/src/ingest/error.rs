//! Errors of the ingest server.

use thiserror::Error;

/// Errors of the ingest server.
#[derive(Debug, Error)]
pub enum IngestError {
    /// The TLS certificate or key cannot be used.
    #[error("cannot serve TLS with the configured certificate and key: {0}")]
    Tls(String),
    /// The gRPC server failed (accept, transport).
    #[error("gRPC ingest server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// No Kubernetes API client for reviewing pod tokens.
    #[error("cannot review agents' pod tokens: {0}")]
    PodTokens(String),
}
