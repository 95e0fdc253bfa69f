//! The loopback stack a comparison runs against: simulated instances, one
//! real agent per instance (events mode, following the instance's ZMQ
//! events) and the real router, all in this process through their libraries.

use crate::error::BenchError;
use crate::sim::{Fleet, SimConfig};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use warmpath_agent::{Agent, AgentConfig};
use warmpath_core::tokenize::ChatTokenizer;
use warmpath_core::Strategy;
use warmpath_router::config::{BackendConfig, PoolConfig, RouterConfig};
use warmpath_router::RunningRouter;

/// A running fleet + agents + router.
#[derive(Debug)]
pub struct Stack {
    /// The simulated instances.
    pub fleet: Fleet,
    /// The router.
    pub router: RunningRouter,
    /// `http://` base URL of the router.
    pub router_url: String,
    /// The served model.
    pub model: String,
    agents: Vec<Agent>,
    model_dir: PathBuf,
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.model_dir);
    }
}

impl Stack {
    /// Starts `n` instances, their agents and a router using `strategy`.
    pub async fn start(
        n: usize,
        sim: &SimConfig,
        strategy: Strategy,
        concurrency_threshold: u32,
        shutdown: CancellationToken,
    ) -> Result<Stack, BenchError> {
        let model_dir = std::env::temp_dir().join(format!(
            "warmpath-bench-tokenizer-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        warmpath_core::tokenize::tiny::write_model_dir(&model_dir)?;
        let tokenizer = std::sync::Arc::new(ChatTokenizer::load(&model_dir)?);
        let fleet = Fleet::start(n, sim, tokenizer, None, shutdown.clone()).await?;
        let mut pool = PoolConfig::new(sim.model.clone());
        pool.strategy = Some(strategy);
        pool.tokenizer = Some(model_dir.clone());
        pool.block_size = sim.block_size;
        pool.prefix_aware.concurrency_threshold = concurrency_threshold;
        for i in &fleet.instances {
            let mut b = BackendConfig::new(i.url.clone());
            b.worker_id = Some(i.id.clone());
            pool.backends.push(b);
        }
        let config = RouterConfig {
            listen: "127.0.0.1:0".into(),
            grpc_listen: Some("127.0.0.1:0".into()),
            pools: vec![pool],
            ..Default::default()
        };
        let router = warmpath_router::start(config, shutdown.clone())
            .await
            .map_err(|e| BenchError::Component {
                what: "router".into(),
                reason: e.to_string(),
            })?;
        let grpc = router.grpc_addr.ok_or_else(|| BenchError::Component {
            what: "router".into(),
            reason: "no gRPC address".into(),
        })?;
        let mut agents = Vec::with_capacity(n);
        for i in &fleet.instances {
            let mut cfg = AgentConfig::new(&i.id, &sim.model, &i.url, &i.kv_events);
            cfg.kv_replay = i.kv_replay.clone();
            cfg.routers = vec![format!("http://{grpc}")];
            cfg.topic = sim.topic.clone();
            let agent = Agent::start(cfg, None)
                .await
                .map_err(|e| BenchError::Component {
                    what: format!("agent {}", i.id),
                    reason: e.to_string(),
                })?;
            agents.push(agent);
        }
        let stack = Stack {
            router_url: format!("http://{}", router.http_addr),
            fleet,
            router,
            model: sim.model.clone(),
            agents,
            model_dir,
        };
        stack.wait_for_agents(Duration::from_secs(20)).await?;
        Ok(stack)
    }

    /// Worker ids, in order.
    pub fn worker_ids(&self) -> Vec<String> {
        self.fleet.instances.iter().map(|i| i.id.clone()).collect()
    }

    /// Waits until the router's `/cache-index` lists every worker.
    async fn wait_for_agents(&self, limit: Duration) -> Result<(), BenchError> {
        let client = reqwest::Client::new();
        let url = format!("{}/cache-index", self.router_url);
        let started = Instant::now();
        loop {
            if let Ok(resp) = client.get(&url).send().await {
                if let Ok(text) = resp.text().await {
                    if self
                        .fleet
                        .instances
                        .iter()
                        .all(|i| text.contains(&format!("\"{}\"", i.id)))
                    {
                        return Ok(());
                    }
                }
            }
            if started.elapsed() > limit {
                return Err(BenchError::Component {
                    what: "agents".into(),
                    reason: format!("not all agents reached the router within {limit:?}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Switches the pool's strategy through the admin API.
    pub async fn set_strategy(
        &self,
        client: &reqwest::Client,
        s: Strategy,
    ) -> Result<(), BenchError> {
        let url = format!("{}/admin/pools/{}/strategy", self.router_url, self.model);
        let resp = client
            .put(&url)
            .json(&serde_json::json!({"strategy": s.as_str()}))
            .send()
            .await
            .map_err(|e| BenchError::Http {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            return Err(BenchError::Http {
                url,
                reason: format!("{status}: {body}"),
            });
        }
        Ok(())
    }

    /// Empties every engine's prefix cache (through vLLM's
    /// `/reset_prefix_cache`), then gives the agents a moment to tell the
    /// router.
    pub async fn reset_caches(&self, client: &reqwest::Client) -> Result<(), BenchError> {
        for i in &self.fleet.instances {
            let url = format!("{}/reset_prefix_cache", i.url);
            let mut tries = 0;
            loop {
                let resp = client
                    .post(&url)
                    .send()
                    .await
                    .map_err(|e| BenchError::Http {
                        url: url.clone(),
                        reason: e.to_string(),
                    })?;
                if resp.status().is_success() {
                    break;
                }
                // 409: requests still hold blocks; they finish soon.
                tries += 1;
                if tries > 50 {
                    return Err(BenchError::Http {
                        url,
                        reason: format!("reset refused: {}", resp.status()),
                    });
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        Ok(())
    }

    /// Stops the agents and the router.
    pub async fn shutdown(mut self) {
        self.router.shutdown();
        for a in std::mem::take(&mut self.agents) {
            a.shutdown().await;
        }
    }
}
