//! `warmpath-bench sim`: simulated vLLM instances that behave like vLLM
//! from the outside (HTTP API, metrics, prefix cache, KV events), so the real
//! agent and router run against them unchanged (docs/bench.md, "Bench").

mod engine;
pub mod events;
mod http;
pub mod output;
#[cfg(test)]
mod tests;

pub use engine::SimEngine;
pub use output::{Output, OutputVocab};

use crate::error::{component, ensure, BenchError};
use crate::timing::TimeModel;
use axum::serve::ListenerExt;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use warmpath_core::tokenize::{CacheConfig, ChatTokenizer};

/// Settings shared by every instance of a fleet; its flags are `sim`'s and
/// `compare`'s.
#[derive(Clone, Debug, serde::Serialize, clap::Args)]
pub struct SimConfig {
    /// Served model name.
    #[arg(long, default_value = "warmpath-tiny")]
    pub model: String,
    /// Tokens per block (vLLM's default).
    #[arg(skip = 16usize)]
    pub block_size: usize,
    /// Prefix cache capacity per instance, in blocks.
    #[arg(long, default_value_t = 8192)]
    pub cache_blocks: usize,
    /// Run the time model this many times faster.
    #[arg(long = "time-scale", default_value = "1", value_parser = scaled_time)]
    pub time: TimeModel,
    /// Do not open replay endpoints.
    #[arg(long = "no-replay", action = clap::ArgAction::SetFalse)]
    pub replay: bool,
    /// Prefill queue bound per instance.
    #[arg(skip = 4096usize)]
    pub max_queue: usize,
}

impl Default for SimConfig {
    /// The flags' defaults.
    fn default() -> Self {
        crate::flag_defaults()
    }
}

/// The default time model `--time-scale` times faster.
fn scaled_time(s: &str) -> Result<TimeModel, String> {
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(TimeModel::default().scaled(f)),
        _ => Err("must be a number > 0".into()),
    }
}

/// The generated tiny tokenizer with its chat template.
pub fn tiny_tokenizer() -> Result<Arc<ChatTokenizer>, BenchError> {
    let files = warmpath_core::tokenize::tiny::files()?;
    let tokenizer = ChatTokenizer::new(&files, CacheConfig::default())?;
    Ok(Arc::new(tokenizer))
}

/// One running simulated instance.
#[derive(Debug)]
pub struct SimInstance {
    /// Its worker id (`sim-<n>`).
    pub id: String,
    /// Base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    /// ZMQ PUB endpoint of its KV events.
    pub kv_events: String,
    /// ZMQ replay endpoint.
    pub kv_replay: Option<String>,
    server: JoinHandle<()>,
}

impl Drop for SimInstance {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn start_one(
    i: usize,
    cfg: &SimConfig,
    tokenizer: Arc<ChatTokenizer>,
    output: Arc<OutputVocab>,
    shutdown: CancellationToken,
) -> Result<SimInstance, BenchError> {
    let (events, endpoints) = events::start(cfg.replay, shutdown.clone()).await?;
    let engine = SimEngine::start(
        cfg.time.clone(),
        cfg.block_size,
        cfg.cache_blocks,
        cfg.max_queue,
        events,
        shutdown.clone(),
    )?;
    let id = format!("sim-{i}");
    let state = Arc::new(http::AppState {
        config: warmpath_openai::ServerConfig {
            model_name: cfg.model.clone(),
            max_model_len: http::MAX_MODEL_LEN,
            block_size: engine.block_size,
            cache_blocks: engine.num_blocks,
            default_max_tokens: http::DEFAULT_MAX_TOKENS,
        },
        engine,
        tokenizer,
        output,
        shutdown: shutdown.clone(),
    });
    let addr = "127.0.0.1:0";
    let bind = |e: std::io::Error| component(format!("listening on {addr}"), e);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(bind)?;
    let http_addr = listener.local_addr().map_err(bind)?;
    let app = warmpath_openai::router(state);
    // Without TCP_NODELAY a streamed chunk written while the response head is
    // still unacknowledged waits for the peer's delayed ACK (~40 ms on Linux).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    let server = tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned());
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "simulated instance server failed");
        }
    });
    tracing::info!(%id, %http_addr, events = %endpoints.events, "simulated instance up");
    Ok(SimInstance {
        id,
        url: format!("http://{http_addr}"),
        kv_events: endpoints.events,
        kv_replay: endpoints.replay,
        server,
    })
}

/// A fleet of simulated instances.
#[derive(Debug)]
pub struct Fleet {
    /// The instances, `sim-0` first.
    pub instances: Vec<SimInstance>,
}

impl Fleet {
    /// Starts `n` instances on ephemeral ports of 127.0.0.1, until `shutdown`.
    pub async fn start(
        n: usize,
        cfg: &SimConfig,
        tokenizer: Arc<ChatTokenizer>,
        shutdown: CancellationToken,
    ) -> Result<Fleet, BenchError> {
        ensure(n > 0, "instances", "must be at least 1")?;
        let output = Arc::new(OutputVocab::new(&tokenizer)?);
        let mut instances = Vec::with_capacity(n);
        for i in 0..n {
            let (tok, out) = (tokenizer.clone(), output.clone());
            instances.push(start_one(i, cfg, tok, out, shutdown.clone()).await?);
        }
        Ok(Fleet { instances })
    }
}
