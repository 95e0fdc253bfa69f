//! `compare --engine candle`: `warmpath-engine --tiny` child processes
//! instead of simulated instances.

use super::child::{binary, spawn_ready};
use crate::error::{component, BenchError};
use crate::sim::SimConfig;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::{Child, Command};

/// How long one engine may take to load and bind.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

/// How to start the real engines.
#[derive(Clone, Debug, Serialize)]
pub struct CandleConfig {
    pub binary: PathBuf,
    /// Longest prefill step in tokens (`--prefill-chunk`).
    pub prefill_chunk: usize,
}

impl CandleConfig {
    /// `given`, else the `warmpath-engine` beside this executable.
    pub fn new(given: Option<&Path>, prefill_chunk: usize) -> Result<Self, BenchError> {
        let build = "build it with `cargo build --release -p warmpath-engine` or pass --engine-bin";
        Ok(CandleConfig {
            binary: binary("warmpath-engine", given, build)?,
            prefill_chunk,
        })
    }
}

#[derive(Debug)]
pub struct CandleInstance {
    /// Worker id (`candle-<i>`).
    pub id: String,
    pub url: String,
    pub kv_events: String,
    pub kv_replay: Option<String>,
    child: Child,
}

#[derive(Debug)]
pub struct CandleFleet {
    pub instances: Vec<CandleInstance>,
}

impl CandleFleet {
    /// Starts `n` engines one after the other (loading is CPU-bound).
    pub async fn start(
        n: usize,
        cfg: &CandleConfig,
        sim: &SimConfig,
        log_dir: &Path,
    ) -> Result<CandleFleet, BenchError> {
        let mut instances = Vec::with_capacity(n);
        for i in 0..n {
            let log = log_dir.join(format!("engine-{i}.log"));
            instances.push(start_one(i, cfg, sim, &log).await?);
        }
        Ok(CandleFleet { instances })
    }

    /// Kills every engine and waits for it.
    pub async fn shutdown(mut self) {
        for i in &mut self.instances {
            if let Err(e) = i.child.kill().await {
                tracing::warn!(engine = %i.id, error = %e, "killing an engine failed");
            }
        }
    }
}

async fn start_one(
    i: usize,
    cfg: &CandleConfig,
    sim: &SimConfig,
    log: &Path,
) -> Result<CandleInstance, BenchError> {
    let id = format!("candle-{i}");
    let mut cmd = Command::new(&cfg.binary);
    cmd.args(["--tiny", "--listen", "127.0.0.1:0"])
        .args(["--kv-events", "tcp://127.0.0.1:0"])
        .args(["--kv-replay", "tcp://127.0.0.1:0"])
        .args(["--model-name", &sim.model])
        .arg(format!("--block-size={}", sim.block_size))
        .arg(format!("--cache-blocks={}", sim.cache_blocks))
        .arg(format!("--prefill-chunk={}", cfg.prefill_chunk));
    let keys = ["listening on ", "kv events on ", "kv replay on "];
    let what = format!("engine {i}");
    let (child, [url, kv_events, kv_replay]) =
        spawn_ready(cmd, &what, log, STARTUP_TIMEOUT, (keys, 0)).await?;
    let (Some(url), Some(kv_events)) = (url, kv_events) else {
        return Err(component(what, "it printed no KV event endpoint"));
    };
    tracing::info!(engine = %id, %url, %kv_events, "engine started");
    Ok(CandleInstance {
        id,
        url,
        kv_events,
        kv_replay,
        child,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_a_clear_error() {
        let err =
            CandleConfig::new(Some(Path::new("/nonexistent/warmpath-engine")), 512).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("not found"), "{text}");
        assert!(
            text.contains("cargo build --release -p warmpath-engine"),
            "{text}"
        );
    }
}
