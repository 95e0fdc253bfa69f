//! Errors of the ingest server.

use thiserror::Error;

/// Errors of the ingest server.
#[derive(Debug, Error)]
pub enum IngestError {
    #[error("cannot serve TLS with the configured certificate and key: {0}")]
    Tls(String),
    #[error("gRPC ingest server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("cannot review agents' pod tokens: {0}")]
    PodTokens(String),
}
