//! Errors of the ingest server.

use thiserror::Error;

/// Errors of the ingest server.
#[derive(Debug, Error)]
pub enum IngestError {
    /// The TLS certificate or key cannot be used (not PEM, key does not
    /// match, unsupported algorithm). Not retryable: fix the files.
    #[error("cannot serve TLS with the configured certificate and key: {0}")]
    Tls(String),
    /// The gRPC server failed (accept, transport). Retrying may work for
    /// transient socket errors.
    #[error("gRPC ingest server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// No Kubernetes API client for reviewing pod tokens
    /// (`ingest.pod_token_audience`): not in a pod and no kubeconfig. Not
    /// retryable: fix the environment.
    #[error("cannot review agents' pod tokens: {0}")]
    PodTokens(String),
}
