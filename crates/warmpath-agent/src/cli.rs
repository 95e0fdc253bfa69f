//! The command line (names as in DESIGN.md) and the [`AgentConfig`] it makes.

use crate::error::AgentError;
use crate::link::LinkConfig;
use clap::Parser;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// warmpath-agent: follows one engine's KV-cache events (`--kv-events`,
/// `--kv-replay`) and publishes its block set to every router; `--listen`
/// serves /metrics, /livez, /readyz and /health.
#[derive(Debug, Parser)]
#[command(name = "warmpath-agent", version)]
pub struct Cli {
    /// Worker id; must match the router's backend worker_id (default: its URL).
    #[arg(
        long,
        env = "WARMPATH_WORKER_ID",
        required_unless_present = "worker_id_from_env"
    )]
    pub worker_id: Option<String>,
    /// Take the worker id from this variable (e.g. `POD_IP`) through `--worker-id-template`.
    #[arg(long, value_name = "VAR", conflicts_with = "worker_id")]
    pub worker_id_from_env: Option<String>,
    /// The worker id around the variable's value `{}`, e.g. `http://{}:8000`.
    #[arg(long, default_value = "{}", value_name = "TEMPLATE")]
    pub worker_id_template: String,
    #[command(flatten)]
    pub config: AgentConfig,
    /// Log format on stderr: text or json (one object per line).
    #[arg(
        long,
        value_name = "FORMAT",
        env = "WARMPATH_LOG_FORMAT",
        default_value_t
    )]
    pub log_format: warmpath_proto::logging::LogFormat,
}

/// Everything the agent needs: its flags (the worker id resolved), plus the
/// HTTP bounds and link tuning tests change.
#[derive(Clone, Debug, clap::Args)]
pub struct AgentConfig {
    #[arg(skip)]
    pub worker_id: String,
    /// Served model name (seeds the block hashes; must match the router pool's).
    #[arg(long)]
    pub model: String,
    /// Engine base URL (load from its /metrics), e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub engine_url: String,
    /// Engine KV-event PUB endpoint (rank 0), e.g. tcp://127.0.0.1:5557.
    #[arg(long)]
    pub kv_events: String,
    /// Engine replay ROUTER endpoint (rank 0), e.g. tcp://127.0.0.1:5558.
    #[arg(long)]
    pub kv_replay: Option<String>,
    /// Router gRPC URL (repeatable): http://, https://, or dns://NAME:PORT for
    /// one stream to each address NAME resolves to (router replicas).
    #[arg(long = "router")]
    pub routers: Vec<String>,
    /// Nameserver (IP:PORT) for dns:// routers (default: the system's).
    #[arg(long, value_name = "IP:PORT")]
    pub router_nameserver: Option<SocketAddr>,
    /// How often dns:// routers are resolved again, in milliseconds (>= 100).
    #[arg(long = "router-dns-interval-ms", value_name = "MS", default_value = "5000", value_parser = millis)]
    pub router_dns_interval: Duration,
    /// PEM root certificate(s) to trust for https routers (default: the system's).
    #[arg(long, value_name = "PATH")]
    pub router_ca: Option<PathBuf>,
    /// Name the router certificate must carry, when it is not the URL's host.
    #[arg(long, value_name = "NAME")]
    pub tls_domain: Option<String>,
    /// This worker's credential (`warmpath-router --print-agent-token WORKER`)
    /// or the routers' shared token.
    #[arg(long, env = "WARMPATH_AGENT_TOKEN", hide_env_values = true)]
    pub agent_token: Option<String>,
    /// A file holding the token, re-read at every connect (in Kubernetes, a
    /// projected ServiceAccount token of audience `ingest.pod_token_audience`).
    #[arg(
        long,
        env = "WARMPATH_AGENT_TOKEN_FILE",
        conflicts_with = "agent_token"
    )]
    pub agent_token_file: Option<PathBuf>,
    /// Send `--agent-token` even over plain http:// to a router on another host.
    #[arg(long)]
    pub insecure: bool,
    /// Data-parallel ranks to follow on port+rank (reported as one worker).
    #[arg(long, default_value_t = 1)]
    pub dp_ranks: u16,
    /// Address for /metrics and /health (port 0: any free port, printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    #[arg(skip)]
    pub http: crate::serve::HttpLimits,
    /// ZMQ topic prefix (vLLM's default is empty).
    #[arg(long, default_value = "")]
    pub topic: String,
    /// Load scrape period in milliseconds (0: off, readiness ignores the engine).
    #[arg(long = "load-interval-ms", value_name = "MS", default_value = "1000", value_parser = millis)]
    pub load_interval: Duration,
    #[arg(skip)]
    pub link: LinkConfig,
    /// /readyz turns 503 when prompt tokens got no KV event for this many ms.
    #[arg(long = "events-silence-ms", value_name = "MS", default_value = "30000", value_parser = millis)]
    pub events_silence: Duration,
}

impl AgentConfig {
    /// The defaults of the flags around the required ones.
    pub fn new(worker_id: &str, model: &str, engine_url: &str, kv_events: &str) -> Self {
        AgentConfig {
            worker_id: worker_id.into(),
            model: model.into(),
            engine_url: engine_url.into(),
            kv_events: kv_events.into(),
            kv_replay: None,
            routers: Vec::new(),
            router_nameserver: None,
            router_dns_interval: Duration::from_secs(5),
            router_ca: None,
            tls_domain: None,
            agent_token: None,
            agent_token_file: None,
            insecure: false,
            dp_ranks: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            http: crate::serve::HttpLimits::default(),
            topic: String::new(),
            load_interval: Duration::from_secs(1),
            link: LinkConfig::default(),
            events_silence: Duration::from_secs(30),
        }
    }
}

fn millis(v: &str) -> Result<Duration, std::num::ParseIntError> {
    v.parse().map(Duration::from_millis)
}

/// The flags of the removed observe mode.
const REMOVED_FLAGS: [&str; 4] = ["--mode", "--tokenizer", "--block-size", "--cache-blocks"];

/// Why the agent refuses `args` when one is a flag of the removed observe
/// mode (clap alone would only call it unexpected).
pub fn removed_flag(args: impl IntoIterator<Item = OsString>) -> Option<String> {
    let flag = args.into_iter().find_map(|a| {
        let a = a.to_string_lossy().into_owned();
        let name = a.split('=').next().unwrap_or_default();
        REMOVED_FLAGS.contains(&name).then(|| name.to_owned())
    })?;
    Some(format!(
        "{flag}: observe mode was removed; the agent follows the engine's KV events only: \
         start vLLM with --kv-events-config '{{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \
         \"endpoint\": \"tcp://*:5557\"}}' and give the agent --kv-events tcp://127.0.0.1:5557"
    ))
}

impl Cli {
    /// The worker id: `--worker-id`, or the template filled from the
    /// environment variable named by `--worker-id-from-env`.
    fn worker_id(&self) -> Result<String, AgentError> {
        let Some(var) = &self.worker_id_from_env else {
            return self
                .worker_id
                .clone()
                .ok_or_else(|| AgentError::Config("--worker-id is required".into()));
        };
        if !self.worker_id_template.contains("{}") {
            return Err(AgentError::Config(format!(
                "--worker-id-template {:?} has no {{}} for the value of {var}",
                self.worker_id_template
            )));
        }
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => Ok(self.worker_id_template.replace("{}", v.trim())),
            _ => Err(AgentError::Config(format!(
                "--worker-id-from-env {var}: the variable is not set (in Kubernetes: env {var} from the Downward API, e.g. fieldRef status.podIP)"
            ))),
        }
    }

    /// The agent configuration.
    pub fn into_config(self) -> Result<AgentConfig, AgentError> {
        if self.config.router_dns_interval < Duration::from_millis(100) {
            return Err(AgentError::Config(
                "--router-dns-interval-ms must be at least 100".into(),
            ));
        }
        let worker_id = self.worker_id()?;
        let mut c = self.config;
        c.worker_id = worker_id;
        c.agent_token = c.agent_token.filter(|t| !t.is_empty());
        Ok(c)
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
            "--dp-ranks",
            "2",
            "--router-ca",
            "/etc/ca.pem",
            "--tls-domain",
            "router.internal",
        ])
        .unwrap();
        let c = cli.into_config().unwrap();
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
    fn the_worker_id_can_come_from_the_environment_and_routers_from_dns() {
        let args = |extra: &[&str]| {
            let mut v = vec![
                "warmpath-agent",
                "--model",
                "m",
                "--engine-url",
                "http://e:1",
                "--kv-events",
                "tcp://e:2",
            ];
            v.extend_from_slice(extra);
            Cli::try_parse_from(v)
        };
        // A variable only this test reads.
        std::env::set_var("WARMPATH_TEST_POD_IP", "10.1.2.3");
        let c = args(&[
            "--worker-id-from-env",
            "WARMPATH_TEST_POD_IP",
            "--worker-id-template",
            "http://{}:8000",
            "--router",
            "dns://routers.svc:50051",
            "--router-nameserver",
            "127.0.0.1:5353",
        ])
        .unwrap()
        .into_config()
        .unwrap();
        assert_eq!(c.worker_id, "http://10.1.2.3:8000");
        assert_eq!(c.router_nameserver, Some("127.0.0.1:5353".parse().unwrap()));
        let e = args(&["--worker-id-from-env", "WARMPATH_TEST_UNSET_VAR"])
            .unwrap()
            .into_config()
            .unwrap_err();
        assert!(e.to_string().contains("WARMPATH_TEST_UNSET_VAR"), "{e}");
        assert!(args(&[]).is_err(), "a worker id is required");
        assert!(args(&["--worker-id", "w", "--worker-id-from-env", "X"]).is_err());
    }
}
