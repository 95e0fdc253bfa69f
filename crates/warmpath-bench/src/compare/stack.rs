//! The stack a comparison runs against: simulated or candle engines, one
//! real agent each and the real router (in process or as R processes),
//! started here on loopback, or a running router and engines attached to.

use super::candle::{CandleConfig, CandleFleet};
use super::replicas::{labelled_sum, router_binary, RouterProcesses};
use crate::error::{component, ensure, BenchError};
use crate::sim::{Fleet, SimConfig};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use warmpath_agent::{Agent, AgentConfig};
use warmpath_core::policy::KvConfig;
use warmpath_core::tokenize::ChatTokenizer;
use warmpath_core::Strategy;
use warmpath_router::config::{BackendConfig, PoolConfig, RouterConfig};
use warmpath_router::RunningRouter;

/// The router's policy settings for a stack started here, and its replicas;
/// its flags are `compare`'s.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct RouterKnobs {
    #[arg(skip)]
    pub kv: KvConfig,
    /// Router replicas: more than 1 runs that many warmpath-router processes.
    #[arg(long, default_value_t = 1)]
    pub routers: usize,
    /// Run even a single router as a warmpath-router process (not in this one).
    #[arg(long = "router-process")]
    pub processes: bool,
    /// The warmpath-router binary of the processes (default: beside this one).
    #[arg(long)]
    pub router_bin: Option<PathBuf>,
    /// The replicas do not share their decisions (`ingest.share_decisions: false`).
    #[arg(long = "no-share-decisions", action = clap::ArgAction::SetFalse)]
    pub share_decisions: bool,
}

impl RouterKnobs {
    pub fn as_processes(&self) -> bool {
        self.processes || self.routers > 1
    }
}

impl Default for RouterKnobs {
    /// The flags' defaults.
    fn default() -> Self {
        crate::flag_defaults()
    }
}

/// Which engines a stack started here runs.
#[derive(Clone, Debug, Serialize)]
pub enum EngineKind {
    Sim,
    Candle(CandleConfig),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EngineEndpoint {
    /// Worker id (what the router reports in `x-warmpath-backend`); empty
    /// when unknown (attach mode).
    pub id: String,
    pub url: String,
}

impl std::str::FromStr for EngineEndpoint {
    type Err = std::convert::Infallible;

    /// `ID=URL` or `URL`: no id, no zero share for an idle engine.
    fn from_str(e: &str) -> Result<Self, Self::Err> {
        let (id, url) = e.split_once('=').unwrap_or(("", e));
        let url = url.trim_end_matches('/').to_owned();
        Ok(EngineEndpoint { id: id.into(), url })
    }
}

/// A running router and engines to attach to; its flags are `compare`'s.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct AttachConfig {
    /// Attach to this running router (http://host:port) instead of starting a stack.
    #[arg(long = "attach-router", required = false, requires = "engines")]
    pub router_url: String,
    /// With --attach-router: the router's admin bearer token (never written to reports).
    #[arg(long, requires = "router_url")]
    #[serde(skip)]
    pub admin_token: Option<String>,
    /// With --attach-router: an engine of the pool, `ID=URL` (ID: its worker id) or `URL`.
    #[arg(long = "attach-engine", value_delimiter = ',', requires = "router_url")]
    pub engines: Vec<EngineEndpoint>,
}

#[derive(Debug)]
enum Engines {
    Sim(Fleet),
    Candle(CandleFleet),
}

#[derive(Debug)]
enum Routers {
    InProcess(Box<RunningRouter>),
    Processes(RouterProcesses),
}

#[derive(Debug)]
struct Owned {
    engines: Engines,
    routers: Routers,
    agents: Vec<Agent>,
    model_dir: PathBuf,
}

/// A router (or its replicas) and its engines, started here or attached to.
#[derive(Debug)]
pub struct Stack {
    /// `http://` base URLs of every router replica, the first one first.
    pub router_urls: Vec<String>,
    pub model: String,
    pub engines: Vec<EngineEndpoint>,
    pub admin_token: Option<String>,
    owned: Option<Owned>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(o) = &self.owned {
            let _ = std::fs::remove_dir_all(&o.model_dir);
        }
    }
}

/// The body of the answer to `req` (to `url`).
async fn text(req: reqwest::RequestBuilder, url: &str) -> Result<String, BenchError> {
    let resp = req.send().await.map_err(|e| http(url, e))?;
    resp.text().await.map_err(|e| http(url, e))
}

impl Stack {
    /// Starts `n` engines of `kind`, their agents and a router using
    /// `strategy`; the admin API is guarded by `admin_token` when given.
    pub async fn start(
        n: usize,
        sim: &SimConfig,
        kind: &EngineKind,
        strategy: Strategy,
        knobs: &RouterKnobs,
        admin_token: Option<String>,
        shutdown: CancellationToken,
    ) -> Result<Stack, BenchError> {
        // Before anything starts: a missing binary is the likely mistake.
        let router_bin = match knobs.as_processes() {
            true => Some(router_binary(knobs.router_bin.as_deref())?),
            false => None,
        };
        let model_dir = std::env::temp_dir().join(format!(
            "warmpath-bench-tokenizer-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        warmpath_core::tokenize::tiny::write_model_dir(&model_dir)?;
        // Each engine's agent, for either kind of engine.
        macro_rules! agents {
            ($fleet:expr) => {
                ($fleet.instances.iter())
                    .map(|i| AgentConfig {
                        kv_replay: i.kv_replay.clone(),
                        ..AgentConfig::new(&i.id, &sim.model, &i.url, &i.kv_events)
                    })
                    .collect::<Vec<_>>()
            };
        }
        let (engines, agent_cfgs) = match kind {
            EngineKind::Sim => {
                let tokenizer = std::sync::Arc::new(ChatTokenizer::load(&model_dir)?);
                let fleet = Fleet::start(n, sim, tokenizer, shutdown.clone()).await?;
                let cfgs = agents!(fleet);
                (Engines::Sim(fleet), cfgs)
            }
            EngineKind::Candle(c) => {
                let fleet = CandleFleet::start(n, c, sim, &model_dir).await?;
                let cfgs = agents!(fleet);
                (Engines::Candle(fleet), cfgs)
            }
        };
        let list: Vec<EngineEndpoint> = (agent_cfgs.iter())
            .map(|c| EngineEndpoint {
                id: c.worker_id.clone(),
                url: c.engine_url.clone(),
            })
            .collect();
        let config = router_config(sim, strategy, knobs, &model_dir, &list, &admin_token);
        let (routers, urls, grpcs) = if let Some(bin) = router_bin {
            let timeout = Duration::from_secs(30);
            let set =
                RouterProcesses::start(knobs.routers, &bin, &config, &model_dir, timeout).await?;
            let urls = set.replicas.iter().map(|r| r.http.clone()).collect();
            let grpcs = set.replicas.iter().map(|r| r.grpc.clone()).collect();
            (Routers::Processes(set), urls, grpcs)
        } else {
            let router = warmpath_router::start(config, shutdown.clone())
                .await
                .map_err(|e| component("router", e))?;
            let grpc = router
                .grpc_addr
                .ok_or_else(|| component("router", "no gRPC address"))?;
            let urls = vec![format!("http://{}", router.http_addr)];
            let grpcs = vec![format!("http://{grpc}")];
            (Routers::InProcess(Box::new(router)), urls, grpcs)
        };
        let mut agents = Vec::with_capacity(n);
        for mut cfg in agent_cfgs {
            cfg.routers = grpcs.clone();
            let id = cfg.worker_id.clone();
            let agent = Agent::start(cfg, None).await;
            agents.push(agent.map_err(|e| component(format!("agent {id}"), e))?);
        }
        let stack = Stack {
            router_urls: urls,
            model: sim.model.clone(),
            engines: list,
            admin_token,
            owned: Some(Owned {
                engines,
                routers,
                agents,
                model_dir,
            }),
        };
        stack.wait_for_agents(Duration::from_secs(20)).await?;
        Ok(stack)
    }

    /// Attaches to a running router and engines serving `model`: checks
    /// that each answers `/health`.
    pub async fn attach(cfg: &AttachConfig, model: &str) -> Result<Stack, BenchError> {
        let why = "name at least one engine URL";
        ensure(!cfg.engines.is_empty(), "attach", why)?;
        let client = reqwest::Client::new();
        let router = cfg.router_url.trim_end_matches('/').to_owned();
        let mut urls = vec![router.clone()];
        urls.extend(cfg.engines.iter().map(|e| e.url.clone()));
        for base in urls {
            let url = format!("{base}/health");
            let status = client
                .get(&url)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .map_err(|e| http(&url, e))?
                .status();
            if !status.is_success() {
                return Err(http(&url, format!("health check answered {status}")));
            }
        }
        Ok(Stack {
            router_urls: vec![router],
            model: model.to_owned(),
            engines: cfg.engines.clone(),
            admin_token: cfg.admin_token.clone(),
            owned: None,
        })
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.admin_token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Waits until every router's `/cache-index` lists every worker.
    async fn wait_for_agents(&self, limit: Duration) -> Result<(), BenchError> {
        let started = Instant::now();
        let client = reqwest::Client::new();
        for base in &self.router_urls {
            let url = format!("{base}/cache-index");
            loop {
                if let Ok(text) = text(self.authed(client.get(&url)), &url).await {
                    let listed = |e: &EngineEndpoint| text.contains(&format!("\"{}\"", e.id));
                    if self.engines.iter().all(listed) {
                        break;
                    }
                }
                if started.elapsed() > limit {
                    return Err(component(
                        "agents",
                        format!("not all agents reached the router {base} within {limit:?}"),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// Switches the pool's strategy through `PUT /admin/pools/{model}/strategy`
    /// on every router.
    pub async fn set_strategy(
        &self,
        client: &reqwest::Client,
        s: Strategy,
    ) -> Result<(), BenchError> {
        for base in &self.router_urls {
            let url = format!("{base}/admin/pools/{}/strategy", self.model);
            let req = client
                .put(&url)
                .json(&serde_json::json!({"strategy": s.as_str()}));
            let resp = self.authed(req).send().await.map_err(|e| http(&url, e))?;
            if !resp.status().is_success() {
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                return Err(http(&url, format!("{status}: {body}")));
            }
        }
        Ok(())
    }

    /// Empties every engine's prefix cache (vLLM's `/reset_prefix_cache`),
    /// then gives the agents a moment to tell the router.
    pub async fn reset_caches(&self, client: &reqwest::Client) -> Result<(), BenchError> {
        for e in &self.engines {
            let url = format!("{}/reset_prefix_cache", e.url);
            let mut tries = 0;
            loop {
                let resp = client.post(&url).send().await.map_err(|e| http(&url, e))?;
                if resp.status().is_success() {
                    break;
                }
                // 409: requests still hold blocks; they finish soon.
                tries += 1;
                if tries > 50 {
                    return Err(http(&url, format!("reset refused: {}", resp.status())));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        Ok(())
    }

    /// Sums vLLM's `prefix_cache_queries_total` and `prefix_cache_hits_total`
    /// (tokens) over every engine's `/metrics`.
    pub async fn engine_prefix_counters(
        &self,
        client: &reqwest::Client,
    ) -> Result<(f64, f64), BenchError> {
        let (mut queries, mut hits) = (0.0, 0.0);
        for e in &self.engines {
            let url = format!("{}/metrics", e.url);
            let text = text(client.get(&url), &url).await?;
            queries += labelled_sum(&text, "vllm:prefix_cache_queries_total", "");
            hits += labelled_sum(&text, "vllm:prefix_cache_hits_total", "");
        }
        Ok((queries, hits))
    }

    /// Per router: the decisions it shared and the ones it received from
    /// the other replicas (`warmpath_replica_facts_total`, every phase).
    pub async fn replica_facts(
        &self,
        client: &reqwest::Client,
    ) -> Result<Vec<(f64, f64)>, BenchError> {
        let name = "warmpath_replica_facts_total";
        let mut out = Vec::with_capacity(self.router_urls.len());
        for base in &self.router_urls {
            let url = format!("{base}/metrics");
            let text = text(self.authed(client.get(&url)), &url).await?;
            out.push((
                labelled_sum(&text, name, "direction=\"sent\""),
                labelled_sum(&text, name, "direction=\"received\""),
            ));
        }
        Ok(out)
    }

    /// Stops what this stack started (nothing when attached).
    pub async fn shutdown(mut self) {
        let Some(o) = self.owned.take() else {
            return;
        };
        // Agents first: a router going away under a live agent is a WARN
        // ("router link down") that a normal shutdown must not print.
        for a in o.agents {
            a.shutdown().await;
        }
        match o.routers {
            Routers::InProcess(r) => r.shutdown(),
            Routers::Processes(set) => set.shutdown().await,
        }
        match o.engines {
            Engines::Candle(f) => f.shutdown().await,
            // Its tasks end with the shutdown token; dropping it frees the handles.
            Engines::Sim(f) => drop(f),
        }
        let _ = std::fs::remove_dir_all(&o.model_dir);
    }
}

/// The pool and router configuration of a stack started here.
fn router_config(
    sim: &SimConfig,
    strategy: Strategy,
    knobs: &RouterKnobs,
    model_dir: &Path,
    backends: &[EngineEndpoint],
    admin_token: &Option<String>,
) -> RouterConfig {
    let mut pool = PoolConfig::new(sim.model.clone());
    pool.strategy = Some(strategy);
    pool.tokenizer = Some(model_dir.to_path_buf());
    pool.block_size = sim.block_size;
    pool.kv = knobs.kv.clone();
    for e in backends {
        let mut b = BackendConfig::new(e.url.clone());
        b.worker_id = Some(e.id.clone());
        pool.backends.push(b);
    }
    let mut config = RouterConfig {
        listen: "127.0.0.1:0".into(),
        grpc_listen: Some("127.0.0.1:0".into()),
        admin_token: admin_token.clone(),
        pools: vec![pool],
        ..Default::default()
    };
    config.ingest.share_decisions = knobs.share_decisions;
    config
}

pub(super) fn http(url: &str, e: impl std::fmt::Display) -> BenchError {
    component(format!("HTTP {url}"), e)
}
