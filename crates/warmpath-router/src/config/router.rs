//! The configuration file's shape: [`RouterConfig`] and its sections,
//! with their defaults, and reading it.

use super::discovery::DiscoveryConfig;
use super::error::ConfigError;
use super::index::IndexSettings;
use super::ingest::IngestSettings;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;
use warmpath_core::policy::KvConfig;
use warmpath_core::Strategy;

pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The whole router configuration (the YAML file's shape).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// HTTP listen address (`host:port`; port 0 picks a free port; other hosts need tokens).
    pub listen: String,
    /// gRPC listen address for agents; none disables the agent ingest.
    pub grpc_listen: Option<String>,
    /// Bearer token of `PUT /admin/...` (and of introspection) when set.
    pub admin_token: Option<String>,
    /// Bearer token of `/cache-index` and `/cache-index/query` only, when set.
    pub inspect_token: Option<String>,
    /// Start even with admin, introspection or the ingest open to other hosts without a token.
    pub insecure: bool,
    /// Secret each worker's own agent credential is derived from (`--print-agent-token WORKER`).
    pub agent_secret: Option<String>,
    /// The agent ingest's TLS and deadlines.
    pub ingest: IngestSettings,
    /// Largest accepted request body in bytes (413 above).
    pub max_body_bytes: usize,
    /// Backend health checking.
    pub health: HealthConfig,
    /// Client connection settings.
    pub server: ServerConfig,
    /// Upstream connection settings.
    pub upstream: UpstreamConfig,
    /// One pool per served model.
    pub pools: Vec<PoolConfig>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            listen: "127.0.0.1:8000".into(),
            grpc_listen: None,
            admin_token: None,
            inspect_token: None,
            insecure: false,
            agent_secret: None,
            ingest: IngestSettings::default(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            health: HealthConfig::default(),
            server: ServerConfig::default(),
            upstream: UpstreamConfig::default(),
            pools: Vec::new(),
        }
    }
}

/// Passive ejection and active probing of backends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Consecutive failures (refused connects, 5xx answers, broken exchanges, failed probes) that eject a backend (>= 1).
    pub eject_after: u32,
    /// What an active probe asks: `health` (`GET /health`) or `completion` (one token).
    pub probe: ProbeKind,
    /// Interval of the active probes (and `/v1/models` adapter discovery), in milliseconds (>= 50).
    pub probe_interval_ms: u64,
    /// Most members of a pool ejected at once, in percent (0..=100; one always may be).
    pub max_ejection_percent: u8,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            eject_after: 3,
            probe: ProbeKind::Health,
            probe_interval_ms: 2000,
            max_ejection_percent: 50,
        }
    }
}

impl HealthConfig {
    /// Timeout of one probe (and of a `/v1/responses` id look-up): one interval, at most 1 s.
    pub fn probe_timeout(&self) -> Duration {
        Duration::from_millis(self.probe_interval_ms.min(1_000))
    }

    /// Back-off of a first ejection, in milliseconds: 2.5 probe intervals (doubled per ejection).
    pub fn first_ejection_ms(&self) -> u64 {
        self.probe_interval_ms.saturating_mul(5) / 2
    }
}

/// The request an active probe sends (`health.probe`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// `GET /health`, 2xx passes (vLLM answers it even while generation hangs).
    #[default]
    Health,
    /// A one-token `POST /v1/completions` of the pool's model: exercises the serving path.
    Completion,
}

/// Client connection settings (the `server:` section).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Time a client has for its first byte and each request's header, in milliseconds (>= 1).
    pub header_timeout_ms: u64,
    /// Most client connections open at once (>= 1; default 80% of the soft open-file limit).
    pub max_connections: Option<usize>,
    /// After SIGTERM, milliseconds served while not ready before accepting stops.
    pub drain_grace_ms: u64,
    /// On a loopback listener, `Host` names answered besides this machine's own (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Milliseconds (>= 1) a client may read nothing of its answer (default 3 `header_timeout_ms`).
    pub send_timeout_ms: Option<u64>,
    /// Request body bytes held at once over every connection (>= 1; default 32 `max_body_bytes`).
    pub max_body_bytes_in_flight: Option<usize>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            header_timeout_ms: 10_000,
            max_connections: None,
            drain_grace_ms: 5_000,
            allowed_hosts: Vec::new(),
            send_timeout_ms: None,
            max_body_bytes_in_flight: None,
        }
    }
}

impl ServerConfig {
    /// Time a client has to send a whole request body once its header is in: 3 header timeouts.
    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.header_timeout_ms.saturating_mul(3))
    }

    /// `send_timeout_ms`, by default 3 header timeouts.
    pub fn send_timeout(&self) -> Duration {
        Duration::from_millis(
            self.send_timeout_ms
                .unwrap_or(self.header_timeout_ms.saturating_mul(3)),
        )
    }

    /// An idle keep-alive connection is closed after 6 header timeouts.
    pub fn keepalive_idle(&self) -> Duration {
        Duration::from_millis(self.header_timeout_ms.saturating_mul(6))
    }

    /// After the drain grace, the longest wait for in-flight requests: 6 graces, at least 1 s.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_grace_ms.saturating_mul(6).max(1_000))
    }
}

/// Upstream HTTP client settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Milliseconds (>= 1) from sending a request to its answer's headers; long prefills must fit.
    pub first_byte_timeout_ms: u64,
    /// The engines' API key (vLLM `--api-key`) sent upstream in place of the client's (default `WARMPATH_UPSTREAM_API_KEY`).
    pub api_key: Option<Secret>,
}

/// A credential, shown as `<redacted>` in any debug output.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub(super) String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// `Authorization: Bearer <value>`, marked sensitive (kept out of HPACK tables).
    pub fn bearer(&self) -> Option<axum::http::HeaderValue> {
        let mut v = axum::http::HeaderValue::from_str(&format!("Bearer {}", self.0)).ok()?;
        v.set_sensitive(true);
        Some(v)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            first_byte_timeout_ms: 600_000,
            api_key: None,
        }
    }
}

impl UpstreamConfig {
    /// Longest silence of an answer's body once its headers are in: `first_byte_timeout_ms`, at most 2 min.
    pub fn stream_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.first_byte_timeout_ms.min(120_000))
    }
}

/// One model pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// The model name clients send (`model` field).
    pub model: String,
    /// Routing strategy; default `kv_aware` with a tokenizer, else `prefix_aware`.
    pub strategy: Option<Strategy>,
    /// tokenizer.json, or a model folder holding it and tokenizer_config.json.
    pub tokenizer: Option<PathBuf>,
    /// Tokens per KV block; must equal the engines' (vLLM default 16).
    pub block_size: usize,
    /// PREFIX_AWARE settings.
    pub prefix_aware: PrefixAwareConfig,
    /// `kv_aware` cost-model knobs.
    pub kv: KvConfig,
    /// Answer `x-warmpath-backend` and `x-warmpath-decision` (off for untrusted clients: they tell what is warm).
    pub expose_routing_headers: bool,
    /// Most prompt tokens accepted (>= 1; default the engines' `max_model_len` - 1).
    pub max_prompt_tokens: Option<usize>,
    /// Where tenant ids come from and what they isolate.
    pub tenants: TenantsConfig,
    /// Show the first characters of the warmest chains' prompts on `/cache-index` (default: hashes only).
    pub show_prompts: bool,
    /// Bounds of the pool's cache index.
    pub index: IndexSettings,
    /// The engines serving this model.
    pub backends: Vec<BackendConfig>,
    /// Providers whose answers are members too (see `config::discovery`).
    pub discovery: Vec<DiscoveryConfig>,
}

/// Every key's default; `model` must still be set (validation refuses "").
impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig::new("")
    }
}

impl PoolConfig {
    /// A pool with default settings and no backends.
    pub fn new(model: impl Into<String>) -> Self {
        PoolConfig {
            model: model.into(),
            strategy: None,
            tokenizer: None,
            block_size: 16,
            prefix_aware: PrefixAwareConfig::default(),
            kv: KvConfig::default(),
            expose_routing_headers: true,
            max_prompt_tokens: None,
            tenants: TenantsConfig::default(),
            show_prompts: false,
            index: IndexSettings::default(),
            backends: Vec::new(),
            discovery: Vec::new(),
        }
    }

    /// The strategy in effect (explicit, else by tokenizer presence).
    pub fn effective_strategy(&self) -> Strategy {
        self.strategy.unwrap_or(if self.tokenizer.is_some() {
            Strategy::KvAware
        } else {
            Strategy::PrefixAware
        })
    }

    /// The core policy settings of this pool.
    pub fn policy_config(&self) -> warmpath_core::PolicyConfig {
        warmpath_core::PolicyConfig {
            concurrency_threshold: self.prefix_aware.concurrency_threshold,
            kv: self.kv.clone(),
            // The bound and the ring's size are the core's defaults.
            ..warmpath_core::PolicyConfig::default()
        }
    }
}

/// A pool's `tenants:` section (docs/tenants.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantsConfig {
    /// Where the tenant id comes from.
    pub from: TenantFrom,
    /// With `from: api_key`, what a client-sent id does.
    pub client_ids: ClientIds,
    /// What the id isolates.
    pub isolation: Isolation,
}

/// `tenants.from`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TenantFrom {
    /// `X-Prefix-Aware-Id`, else `prompt_cache_key`, else `cache_salt`, as sent.
    #[default]
    Header,
    /// A hash of the client's `Authorization: Bearer` key (401 without one).
    ApiKey,
}

/// `tenants.client_ids`: a client-sent id under `from: api_key`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientIds {
    /// Scoped under the key (`<key hash>/<id>`).
    #[default]
    Scope,
    /// Answered 403.
    Refuse,
}

/// `tenants.isolation`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// The id salts the block hashes and is forwarded as `cache_salt`: no shared engine cache.
    #[default]
    Engine,
    /// The id picks the route only: tenants share the engine's cache (timing leaks across them).
    RouteOnly,
}

/// The characters (or tokens of a token-id prompt) hashed for a prefix key.
pub const PREFIX_LENGTH: usize = 4096;

/// PREFIX_AWARE settings of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefixAwareConfig {
    /// In flight at which a backend counts as full (1..=1024).
    pub concurrency_threshold: u32,
}

impl Default for PrefixAwareConfig {
    fn default() -> Self {
        PrefixAwareConfig {
            concurrency_threshold: 64,
        }
    }
}

/// One backend engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Base URL, `http://host:port` (optionally with a path prefix).
    pub url: String,
    /// The id its agent reports; defaults to the url.
    pub worker_id: Option<String>,
    /// This engine's API key, in place of `upstream.api_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<Secret>,
}

impl BackendConfig {
    /// A backend at `url` with the default id.
    pub fn new(url: impl Into<String>) -> Self {
        BackendConfig {
            url: url.into(),
            worker_id: None,
            api_key: None,
        }
    }

    /// The worker id in effect.
    pub fn id(&self) -> &str {
        self.worker_id.as_deref().unwrap_or(&self.url)
    }
}

impl RouterConfig {
    /// Reads and parses a YAML file (not yet validated).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let parse = |source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        };
        super::removed::check(&yaml_serde::from_str(&text).map_err(parse)?)?;
        Self::from_yaml(&text).map_err(parse)
    }

    /// Parses YAML text (not yet validated).
    pub fn from_yaml(text: &str) -> Result<Self, yaml_serde::Error> {
        yaml_serde::from_str(text)
    }

    /// `server.max_body_bytes_in_flight`, by default 32 largest bodies.
    pub fn max_body_bytes_in_flight(&self) -> usize {
        self.server
            .max_body_bytes_in_flight
            .unwrap_or(self.max_body_bytes.saturating_mul(32))
    }
}

/// The `Host` names a loopback listener answers, port aside (lowercase);
/// `None` for a listener other hosts reach (names are the deployment's).
pub fn loopback_hosts(listen: &str, allowed: &[String]) -> Option<Vec<String>> {
    let (host, _) = split_port(listen);
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return None;
    }
    let mut names: Vec<String> = ["localhost", "127.0.0.1", "[::1]", host]
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    names.extend(allowed.iter().map(|h| split_port(h).0.to_ascii_lowercase()));
    names.sort();
    names.dedup();
    Some(names)
}

/// `host[:port]` split at the port (an IPv6 literal keeps its brackets).
pub(crate) fn split_port(authority: &str) -> (&str, Option<&str>) {
    if let Some(end) = authority.strip_prefix('[').and_then(|r| r.find(']')) {
        let (host, rest) = authority.split_at(end + 2);
        return (host, rest.strip_prefix(':'));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, Some(p)),
        _ => (authority, None),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn loopback_listeners_know_their_names() {
        let names = loopback_hosts("127.0.0.1:0", &["Router.Local:9".into()]).unwrap();
        assert_eq!(names, ["127.0.0.1", "[::1]", "localhost", "router.local"]);
        assert!(loopback_hosts("[::1]:8000", &[])
            .unwrap()
            .contains(&"[::1]".into()));
        assert!(loopback_hosts("localhost:8000", &[]).is_some());
        assert!(loopback_hosts("0.0.0.0:8000", &[]).is_none());
        assert!(loopback_hosts("10.0.0.1:8000", &[]).is_none());
        assert_eq!(split_port("[::1]:80"), ("[::1]", Some("80")));
        assert_eq!(split_port("[::1]"), ("[::1]", None));
        assert_eq!(split_port("h:1"), ("h", Some("1")));
    }
}
