//! The router's configuration: a YAML file ([`RouterConfig`]) with command-line
//! flags laid over it ([`Cli::overlay`]), validated once ([`RouterConfig::validate`]).
//!
//! ```yaml
//! listen: 0.0.0.0:8000
//! grpc_listen: 0.0.0.0:50051
//! admin_token: secret          # guards PUT /admin/... and /cache-index
//! agent_secret: fleet-secret    # each agent presents its worker's own credential
//! ingest:                       # the agent ingest on grpc_listen
//!   tls_cert: /etc/warmpath/router.pem  # PEM chain; with tls_key: serve TLS
//!   tls_key: /etc/warmpath/router.key
//!   stale_after_ms: 10000       # silent agent: its entries stop counting (cleared after 12x)
//! pools:
//!   - model: meta-llama/Llama-3.1-8B-Instruct
//!     strategy: kv_aware
//!     tokenizer: /models/llama            # tokenizer.json or a model folder
//!     block_size: 16
//!     prefix_aware: { concurrency_threshold: 64 }
//!     tenants: { from: api_key, client_ids: scope, isolation: engine }
//!     index: { max_entries: 16777216 }   # index bounds
//!     backends:
//!       - { url: "http://10.0.0.1:8000", worker_id: gpu-0 }  # LoRA adapters: from its /v1/models
//!       - { url: "http://10.0.0.2:8000" }  # worker_id defaults to the url
//! ```
//!
//! Flags: `--listen`, `--grpc-listen`, `--admin-token`, `--agent-secret`,
//! `--agent-tls-cert`, `--agent-tls-key`, `--agent-stale-after-ms`,
//! `--max-body-bytes`, `--header-timeout-ms`,
//! `--max-connections` and `--drain-grace-ms` replace the file's values. Pool flags (`--model`,
//! `--backend` (repeatable, replaces the pool's backends), `--strategy`,
//! `--tokenizer`, `--block-size`, `--concurrency-threshold`)
//! apply to the pool named by `--model` (created when the file has no such
//! pool), or to the file's only pool.

mod cli;
mod discovery;
mod error;
mod index;
mod ingest;
#[cfg(test)]
mod reference_tests;
mod removed;
mod router;
mod validate;

pub use cli::Cli;
pub use discovery::{DiscoveryConfig, DnsDiscovery, KubernetesDiscovery};
pub(crate) use error::invalid;
pub use error::ConfigError;
pub use index::{IndexSettings, COMPACT_INTERVAL_MS};
pub use ingest::{IngestSettings, TlsPem};
pub(crate) use router::split_port;
pub use router::{
    loopback_hosts, BackendConfig, ClientIds, HealthConfig, Isolation, PoolConfig,
    PrefixAwareConfig, ProbeKind, RouterConfig, Secret, ServerConfig, TenantFrom, TenantsConfig,
    UpstreamConfig, DEFAULT_MAX_BODY_BYTES, PREFIX_LENGTH,
};
pub use validate::BackendUrl;
