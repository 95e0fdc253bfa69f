//! The router's configuration: a YAML file ([`RouterConfig`], docs/configuration.md)
//! with command-line flags laid over it, validated once.

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
