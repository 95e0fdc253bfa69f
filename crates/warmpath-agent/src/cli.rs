//! The command line (names as in DESIGN.md), turned into an [`AgentConfig`].

use crate::agent::{AgentConfig, Mode};
use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CliMode {
    /// Follow the engine's KV events.
    Events,
    /// Sidecar HTTP proxy in front of an engine without KV events: tokenizes
    /// every prompt it forwards and keeps an LRU mirror of the engine's cache.
    Observe,
}

/// warmpath-agent: follows one engine's KV-cache events and publishes its block
/// set to every router.
///
/// Events mode (default): `--kv-events` (and `--kv-replay`) point at the
/// engine's vLLM event sockets; `--listen` serves /metrics and /health.
///
/// Observe mode, for engines without KV events: `--listen` is an HTTP proxy
/// to `--engine-url` (send the engine's traffic, or point the router's backend,
/// there); every chat/completion prompt it forwards is tokenized with
/// `--tokenizer` and hashed with `--block-size` into an LRU mirror of
/// `--cache-blocks` blocks. The agent's own pages are /warmpath/metrics,
/// /warmpath/livez, /warmpath/readyz and /warmpath/health; every other path
/// goes to the engine.
#[derive(Debug, Parser)]
#[command(name = "warmpath-agent", version)]
pub struct Cli {
    /// Worker id; must match the router's backend worker_id (default: its URL).
    #[arg(long, env = "WARMPATH_WORKER_ID")]
    pub worker_id: String,
    /// Served model name (seeds the block hashes; must match the router pool's).
    #[arg(long)]
    pub model: String,
    /// Engine base URL (load from its /metrics; observe mode proxies to it),
    /// e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub engine_url: String,
    /// Engine KV-event PUB endpoint (rank 0), e.g. tcp://127.0.0.1:5557.
    /// Required in events mode.
    #[arg(long)]
    pub kv_events: Option<String>,
    /// Engine replay ROUTER endpoint (rank 0), e.g. tcp://127.0.0.1:5558.
    #[arg(long)]
    pub kv_replay: Option<String>,
    /// Router gRPC URL (repeatable), e.g. http://10.0.0.2:50051, or
    /// https://... for a router serving TLS.
    #[arg(long = "router")]
    pub routers: Vec<String>,
    /// PEM root certificate(s) to trust for https routers (needed for a
    /// self-signed router certificate or a private CA; default: the system's).
    #[arg(long, value_name = "PATH")]
    pub router_ca: Option<PathBuf>,
    /// Name the router certificate must carry, when it is not the URL's host
    /// (e.g. the router is reached by IP).
    #[arg(long, value_name = "NAME")]
    pub tls_domain: Option<String>,
    /// How to learn the engine's cache.
    #[arg(long, value_enum, default_value = "events")]
    pub mode: CliMode,
    /// Tokenizer: tokenizer.json or a model folder with tokenizer_config.json
    /// (required in observe mode; the same one the router's pool uses).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Observe mode: KV-cache blocks the engine holds (size of the LRU mirror).
    #[arg(long, default_value_t = 100_000)]
    pub cache_blocks: usize,
    /// Observe mode: the engine's KV block size in tokens (vLLM's default: 16).
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// This worker's credential for the routers (`warmpath-router
    /// --print-agent-token WORKER`), or their shared token; sent as
    /// `authorization: Bearer ...`.
    #[arg(long, env = "WARMPATH_AGENT_TOKEN", hide_env_values = true)]
    pub agent_token: Option<String>,
    /// Send `--agent-token` even over plain http:// to a router on another host.
    #[arg(long)]
    pub insecure: bool,
    /// Data-parallel ranks to follow on port+rank (reported as one worker).
    #[arg(long, default_value_t = 1)]
    pub dp_ranks: u16,
    /// Address for /metrics and /health, or of the proxy in observe mode
    /// (port 0: any free port, printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// ZMQ topic prefix (vLLM's default is empty).
    #[arg(long, default_value = "")]
    pub topic: String,
    /// Load scrape period in milliseconds (0: off, and engine reachability
    /// is not part of readiness).
    #[arg(long, default_value_t = 1000)]
    pub load_interval_ms: u64,
    /// Events mode: /readyz turns 503 when the engine served prompt tokens
    /// and no KV event followed for this many milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub events_silence_ms: u64,
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
    /// The agent configuration.
    pub fn into_config(self) -> AgentConfig {
        let mut c = AgentConfig::new(
            &self.worker_id,
            &self.model,
            &self.engine_url,
            self.kv_events.as_deref().unwrap_or_default(),
        );
        c.kv_replay = self.kv_replay;
        c.routers = self.routers;
        c.router_ca = self.router_ca;
        c.tls_domain = self.tls_domain;
        c.mode = match self.mode {
            CliMode::Events => Mode::Events,
            CliMode::Observe => Mode::Observe,
        };
        c.agent_token = self.agent_token.filter(|t| !t.is_empty());
        c.insecure = self.insecure;
        c.dp_ranks = self.dp_ranks;
        c.listen = self.listen;
        c.topic = self.topic;
        c.load_interval = Duration::from_millis(self.load_interval_ms);
        c.events_silence = Duration::from_millis(self.events_silence_ms);
        c.tokenizer = self.tokenizer;
        c.cache_blocks = self.cache_blocks;
        c.block_size = self.block_size;
        c
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn design_md_command_line_parses() {
        let cli = Cli::try_parse_from([
            "warmpath-agent",
            "--worker-id",
            "w1",
            "--model",
            "m",
            "--engine-url",
            "http://127.0.0.1:8000",
            "--kv-events",
            "tcp://127.0.0.1:5557",
            "--kv-replay",
            "tcp://127.0.0.1:5558",
            "--router",
            "http://127.0.0.1:1",
            "--router",
            "http://127.0.0.1:2",
            "--mode",
            "events",
            "--dp-ranks",
            "2",
            "--router-ca",
            "/etc/ca.pem",
            "--tls-domain",
            "router.internal",
        ])
        .unwrap();
        let c = cli.into_config();
        assert_eq!(
            c.router_ca.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        assert_eq!(c.tls_domain.as_deref(), Some("router.internal"));
        assert_eq!(c.routers.len(), 2);
        assert_eq!(c.dp_ranks, 2);
        assert_eq!(c.kv_replay.as_deref(), Some("tcp://127.0.0.1:5558"));
        assert!(Cli::try_parse_from(["warmpath-agent", "--model", "m"]).is_err());
    }

    #[test]
    fn observe_mode_needs_no_event_socket() {
        let cli = Cli::try_parse_from([
            "warmpath-agent",
            "--worker-id",
            "w1",
            "--model",
            "m",
            "--engine-url",
            "http://127.0.0.1:8000",
            "--mode",
            "observe",
            "--tokenizer",
            "/models/llama",
            "--cache-blocks",
            "5000",
            "--block-size",
            "32",
        ])
        .unwrap();
        let c = cli.into_config();
        assert_eq!(c.mode, Mode::Observe);
        assert_eq!((c.cache_blocks, c.block_size), (5000, 32));
        assert_eq!(
            c.tokenizer.as_deref(),
            Some(std::path::Path::new("/models/llama"))
        );
        assert!(c.kv_events.is_empty());
    }
}
