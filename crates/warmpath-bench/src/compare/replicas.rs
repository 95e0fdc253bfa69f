//! `compare --routers R`: R `warmpath-router` processes over the same pool,
//! each with the in-process router's configuration written as JSON (which
//! the router's YAML loader reads).

use super::child::{binary, spawn_ready};
use crate::error::{component, io, BenchError};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::{Child, Command};
use warmpath_router::config::RouterConfig;

/// The `warmpath-router` binary: `given`, else the one beside this one.
pub fn router_binary(given: Option<&Path>) -> Result<PathBuf, BenchError> {
    let build = "build it with `cargo build -p warmpath-router` (with `--release` for a release bench) or pass --router-bin";
    binary("warmpath-router", given, build)
}

#[derive(Debug)]
pub struct RouterProcess {
    /// `http://` base URL of its client port.
    pub http: String,
    /// `http://` URL of its agent ingest (gRPC).
    pub grpc: String,
    child: Child,
}

#[derive(Debug)]
pub struct RouterProcesses {
    pub replicas: Vec<RouterProcess>,
}

impl RouterProcesses {
    /// Starts `n` routers of `binary` over `config` on 127.0.0.1 port 0,
    /// configs and logs in `dir`.
    pub async fn start(
        n: usize,
        binary: &Path,
        config: &RouterConfig,
        dir: &Path,
        startup_timeout: Duration,
    ) -> Result<RouterProcesses, BenchError> {
        let config = RouterConfig {
            listen: "127.0.0.1:0".into(),
            grpc_listen: Some("127.0.0.1:0".into()),
            ..config.clone()
        };
        let text =
            serde_json::to_string_pretty(&config).map_err(|e| component("router config", e))?;
        let mut replicas = Vec::with_capacity(n);
        for i in 0..n {
            let path = dir.join(format!("router-{i}.yaml"));
            std::fs::write(&path, &text).map_err(io(&path))?;
            let log = dir.join(format!("router-{i}.log"));
            replicas.push(start_one(i, binary, &path, &log, startup_timeout).await?);
        }
        Ok(RouterProcesses { replicas })
    }

    /// Kills every router and waits for it.
    pub async fn shutdown(mut self) {
        for (i, r) in self.replicas.iter_mut().enumerate() {
            if let Err(e) = r.child.kill().await {
                tracing::warn!(router = i, error = %e, "killing a router failed");
            }
        }
    }
}

async fn start_one(
    i: usize,
    binary: &Path,
    config: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<RouterProcess, BenchError> {
    let mut cmd = Command::new(binary);
    cmd.arg("--config").arg(config);
    let keys = ["listening on ", "grpc listening on "];
    let what = format!("router {i}");
    let (child, [http, grpc]) = spawn_ready(cmd, &what, log, timeout, (keys, 1)).await?;
    let (Some(http), Some(grpc)) = (http, grpc) else {
        return Err(component(
            what,
            "it printed no HTTP address before its gRPC one",
        ));
    };
    tracing::info!(router = i, %http, %grpc, "router replica started");
    Ok(RouterProcess { http, grpc, child })
}

/// The sum of the samples of `name` whose labels include `label`
/// (`direction="received"`; empty: every sample) in Prometheus text.
pub fn labelled_sum(text: &str, name: &str, label: &str) -> f64 {
    let labelled = |labels: &str| {
        labels
            .trim_matches(['{', '}'])
            .split(',')
            .any(|kv| kv.trim() == label)
    };
    warmpath_agent::load::samples(text, name)
        .filter(|(labels, _)| label.is_empty() || labelled(labels))
        .filter_map(|(_, v)| v)
        .sum::<f64>()
        // An empty sum is -0.
        + 0.0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_router::config::{BackendConfig, PoolConfig};

    #[test]
    fn a_missing_binary_is_a_clear_error_naming_the_build() {
        let err = router_binary(Some(Path::new("/nonexistent/warmpath-router"))).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("not found"), "{text}");
        assert!(text.contains("cargo build -p warmpath-router"), "{text}");
    }

    /// The file a replica reads is the in-process router's configuration.
    #[test]
    fn the_written_config_reads_back_as_the_same_config() {
        let mut pool = PoolConfig::new("m".to_owned());
        pool.kv.rebalance_slack = None;
        pool.backends.push(BackendConfig::new("http://127.0.0.1:1"));
        let cfg = RouterConfig {
            listen: "127.0.0.1:0".into(),
            pools: vec![pool],
            ..Default::default()
        };
        let text = serde_json::to_string_pretty(&cfg).unwrap();
        assert_eq!(RouterConfig::from_yaml(&text).unwrap(), cfg);
    }

    #[test]
    fn labelled_sum_keeps_the_samples_with_the_label() {
        let text = "# HELP warmpath_replica_facts_total x\n\
                    warmpath_replica_facts_total{pool=\"m\",direction=\"sent\"} 7\n\
                    warmpath_replica_facts_total{pool=\"m\",direction=\"received\"} 5\n\
                    warmpath_replica_facts_total{pool=\"n\",direction=\"received\"} 2\n\
                    warmpath_replica_facts_total_other{direction=\"received\"} 99\n";
        let name = "warmpath_replica_facts_total";
        assert_eq!(labelled_sum(text, name, "direction=\"received\""), 7.0);
        assert_eq!(labelled_sum(text, name, "direction=\"sent\""), 7.0);
        assert_eq!(labelled_sum(text, name, "direction=\"dropped\""), 0.0);
    }

    #[test]
    fn an_empty_label_adds_every_sample_of_one_name() {
        let text = "# TYPE vllm:prefix_cache_hits_total counter\n\
                    vllm:prefix_cache_hits_total{model_name=\"m\"} 10\n\
                    vllm:prefix_cache_hits_total_other 99\n\
                    vllm:prefix_cache_hits_total{model_name=\"n\"} 5.5\n\
                    vllm:prefix_cache_queries_total 7\n";
        assert_eq!(labelled_sum(text, "vllm:prefix_cache_hits_total", ""), 15.5);
        assert_eq!(
            labelled_sum(text, "vllm:prefix_cache_queries_total", ""),
            7.0
        );
        assert_eq!(labelled_sum(text, "vllm:missing", ""), 0.0);
    }
}
