//! Command-line flags and how they are laid over the config file.

use super::error::{invalid, ConfigError};
use super::router::{BackendConfig, PoolConfig, RouterConfig, Secret};
use clap::Parser;
use std::path::PathBuf;
use warmpath_core::Strategy;

/// `warmpath-router` command line. Flags override the config file.
#[derive(Clone, Debug, Default, Parser)]
#[command(
    name = "warmpath-router",
    version,
    about = "KV-cache-aware OpenAI-compatible router"
)]
pub struct Cli {
    /// YAML config file (re-read on SIGHUP).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// HTTP listen address.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// gRPC listen address for agents.
    #[arg(long, value_name = "ADDR")]
    pub grpc_listen: Option<String>,
    /// Backend base URL (repeatable); replaces the pool's backends.
    #[arg(long = "backend", value_name = "URL")]
    pub backends: Vec<String>,
    /// Model (pool) the pool flags apply to.
    #[arg(long)]
    pub model: Option<String>,
    /// random | least_outstanding | prefix_aware | kv_aware.
    #[arg(long)]
    pub strategy: Option<Strategy>,
    /// tokenizer.json or a model folder with tokenizer_config.json.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// Tokens per KV block (must equal the engines').
    #[arg(long)]
    pub block_size: Option<usize>,
    /// In flight at which a backend is full (1..=1024).
    #[arg(long)]
    pub concurrency_threshold: Option<u32>,
    /// Bearer token for `PUT /admin/...` (also accepted by `/cache-index`).
    #[arg(long, env = "WARMPATH_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Bearer token for `/cache-index` and `/cache-index/query` only.
    #[arg(long, env = "WARMPATH_INSPECT_TOKEN", hide_env_values = true)]
    pub inspect_token: Option<String>,
    /// Start even with admin, introspection or the ingest open to other hosts without a token.
    #[arg(long)]
    pub insecure: bool,
    /// Secret each worker's agent credential is derived from.
    #[arg(long, env = "WARMPATH_AGENT_SECRET", hide_env_values = true)]
    pub agent_secret: Option<String>,
    /// The engines' API key, sent upstream in place of the client's (`upstream.api_key`).
    #[arg(long, env = "WARMPATH_UPSTREAM_API_KEY", hide_env_values = true)]
    pub upstream_api_key: Option<String>,
    /// Load and validate the configuration, print `configuration OK`, and exit.
    #[arg(long)]
    pub check_config: bool,
    /// Print the agent credential of WORKER under `agent_secret`, and exit.
    #[arg(long, value_name = "WORKER")]
    pub print_agent_token: Option<String>,
    /// PEM certificate chain for the agent ingest: serve TLS (with `--agent-tls-key`).
    #[arg(long, value_name = "PATH")]
    pub agent_tls_cert: Option<PathBuf>,
    /// PEM private key of `--agent-tls-cert`.
    #[arg(long, value_name = "PATH")]
    pub agent_tls_key: Option<PathBuf>,
    /// Silence after which an agent's entries stop counting (ms, default 10000).
    #[arg(long, value_name = "MS")]
    pub agent_stale_after_ms: Option<u64>,
    /// Largest accepted request body in bytes (default 32 MiB).
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Time a client has to send a request header (ms, default 10000).
    #[arg(long, value_name = "MS")]
    pub header_timeout_ms: Option<u64>,
    /// Most client connections open at once (default: 80% of the open-file limit).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Time served after SIGTERM while not ready, before accepting stops (ms, default 5000).
    #[arg(long, value_name = "MS")]
    pub drain_grace_ms: Option<u64>,
    /// Log format on stderr: text or json (one object per line).
    #[arg(
        long,
        value_name = "FORMAT",
        env = "WARMPATH_LOG_FORMAT",
        default_value_t
    )]
    pub log_format: warmpath_proto::logging::LogFormat,
}

impl Cli {
    /// Reads `--config` (if any) and lays the flags over it (not yet validated).
    pub fn load(&self) -> Result<RouterConfig, ConfigError> {
        let base = match &self.config {
            Some(path) => RouterConfig::from_file(path)?,
            None => RouterConfig::default(),
        };
        self.overlay(base)
    }

    /// Lays the flags over `config`.
    pub fn overlay(&self, mut config: RouterConfig) -> Result<RouterConfig, ConfigError> {
        set(&mut config.listen, &self.listen);
        set(&mut config.grpc_listen, &self.grpc_listen);
        set(&mut config.admin_token, &self.admin_token);
        set(&mut config.inspect_token, &self.inspect_token);
        config.insecure |= self.insecure;
        if let Some(v) = &self.upstream_api_key {
            config.upstream.api_key = Some(Secret::new(v.clone()));
        }
        set(&mut config.agent_secret, &self.agent_secret);
        set(&mut config.max_body_bytes, &self.max_body_bytes);
        set(
            &mut config.server.header_timeout_ms,
            &self.header_timeout_ms,
        );
        set(&mut config.server.max_connections, &self.max_connections);
        set(&mut config.server.drain_grace_ms, &self.drain_grace_ms);
        set(&mut config.ingest.tls_cert, &self.agent_tls_cert);
        set(&mut config.ingest.tls_key, &self.agent_tls_key);
        set(
            &mut config.ingest.stale_after_ms,
            &self.agent_stale_after_ms,
        );
        let pool_flags = !self.backends.is_empty()
            || self.strategy.is_some()
            || self.tokenizer.is_some()
            || self.block_size.is_some()
            || self.concurrency_threshold.is_some();
        if self.model.is_none() && !pool_flags {
            return Ok(config);
        }
        let idx = match &self.model {
            Some(m) => match config.pools.iter().position(|p| &p.model == m) {
                Some(i) => i,
                None => {
                    config.pools.push(PoolConfig::new(m.clone()));
                    config.pools.len() - 1
                }
            },
            None if config.pools.len() == 1 => 0,
            None if config.pools.is_empty() => {
                return Err(invalid("--model", "pool flags were given without --model"))
            }
            None => {
                return Err(invalid(
                    "--model",
                    "the config has several pools; say which one the pool flags apply to",
                ))
            }
        };
        let pool = &mut config.pools[idx];
        if !self.backends.is_empty() {
            pool.backends = self.backends.iter().map(BackendConfig::new).collect();
        }
        set(&mut pool.strategy, &self.strategy);
        set(&mut pool.tokenizer, &self.tokenizer);
        set(&mut pool.block_size, &self.block_size);
        set(
            &mut pool.prefix_aware.concurrency_threshold,
            &self.concurrency_threshold,
        );
        Ok(config)
    }
}

/// A flag given replaces the file's value (as `Some` for an optional setting).
fn set<T: Clone, U: From<T>>(dst: &mut U, flag: &Option<T>) {
    if let Some(v) = flag {
        *dst = U::from(v.clone());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cli(args: &[&str]) -> Cli {
        let mut all = vec!["warmpath-router"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap()
    }

    #[test]
    fn flags_alone_make_one_pool() {
        let c = cli(&[
            "--model",
            "m",
            "--backend",
            "http://127.0.0.1:1",
            "--backend",
            "http://127.0.0.1:2",
            "--strategy",
            "least_outstanding",
            "--listen",
            "127.0.0.1:0",
        ])
        .load()
        .unwrap();
        assert_eq!(c.listen, "127.0.0.1:0");
        assert_eq!(c.pools.len(), 1);
        let p = &c.pools[0];
        assert_eq!(p.backends.len(), 2);
        assert_eq!(p.backends[1].id(), "http://127.0.0.1:2");
        assert_eq!(p.effective_strategy(), Strategy::LeastOutstanding);
        c.validate().unwrap();
    }

    #[test]
    fn flags_override_the_only_pool_of_a_file() {
        let file = RouterConfig::from_yaml(
            "pools:\n  - model: m\n    backends: [{url: 'http://127.0.0.1:9', worker_id: w}]\n",
        )
        .unwrap();
        let c = cli(&["--concurrency-threshold", "3"])
            .overlay(file)
            .unwrap();
        let p = &c.pools[0];
        assert_eq!(p.prefix_aware.concurrency_threshold, 3);
        assert_eq!(p.backends[0].id(), "w", "backends kept without --backend");
    }

    #[test]
    fn ingest_flags_override_the_file() {
        let file =
            RouterConfig::from_yaml("ingest: {stale_after_ms: 1000, tls_cert: /a.pem}\n").unwrap();
        let c = cli(&[
            "--agent-tls-cert",
            "/c.pem",
            "--agent-tls-key",
            "/k.pem",
            "--agent-stale-after-ms",
            "9000",
        ])
        .overlay(file)
        .unwrap();
        assert_eq!(c.ingest.tls_cert.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(c.ingest.tls_key.as_deref(), Some(Path::new("/k.pem")));
        assert_eq!(c.ingest.stale_after_ms, 9000);
    }

    #[test]
    fn pool_flags_need_a_pool() {
        let err = cli(&["--strategy", "random"]).load().unwrap_err();
        assert!(err.to_string().contains("--model"), "{err}");
        let err = Cli::try_parse_from(["warmpath-router", "--strategy", "fastest"]).unwrap_err();
        assert!(err.to_string().contains("unknown strategy"), "{err}");
    }
}
