//! `warmpath-engine`: serve a Llama model (or the tiny random one) over an
//! OpenAI-compatible API with a block-level prefix cache, publishing
//! vLLM-style KV events.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use warmpath_engine::device::{open_device, parse_dtype};
use warmpath_engine::http::{router, AppState, ServerConfig};
use warmpath_engine::model_dir::{write_random_model_dir, ModelDirOptions};
use warmpath_engine::{load, worker, Engine, EngineOptions, EventSink, ModelSource, SizePreset};

/// Command line, as in DESIGN.md.
#[derive(Debug, Parser)]
#[command(name = "warmpath-engine", version, about)]
struct Cli {
    /// Serve the tiny deterministic random-weight Llama with the project's tokenizer.
    #[arg(long, conflicts_with_all = ["model_dir", "random_shape", "random_size"])]
    tiny: bool,
    /// A model folder: config.json, *.safetensors (or a sharded index),
    /// tokenizer.json and tokenizer_config.json with the chat template.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Random weights shaped by this config.json, over the tiny tokenizer (benchmarks).
    #[arg(long, conflicts_with_all = ["model_dir", "random_size"])]
    random_shape: Option<PathBuf>,
    /// Random weights of a preset shape over the tiny tokenizer: tiny or 1b (benchmarks).
    #[arg(long, value_enum, conflicts_with = "model_dir")]
    random_size: Option<SizePreset>,
    /// Write a Hugging Face style model folder (random weights of --random-size,
    /// default tiny, from --seed, stored in --dtype; the tiny tokenizer) and exit.
    #[arg(long, conflicts_with_all = ["model_dir", "random_shape", "tiny"])]
    write_model_dir: Option<PathBuf>,
    /// Safetensors files for --write-model-dir (more than 1 writes an index).
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// HTTP address, e.g. 127.0.0.1:8000 (port 0 picks one; it is printed).
    #[arg(long, required_unless_present = "write_model_dir")]
    listen: Option<String>,
    /// ZMQ endpoint for KV events (vLLM style), e.g. tcp://127.0.0.1:5557; omit for none.
    #[arg(long)]
    kv_events: Option<String>,
    /// ZMQ endpoint for the replay socket (ROUTER).
    #[arg(long)]
    kv_replay: Option<String>,
    /// Topic of published KV events.
    #[arg(long, default_value = "")]
    kv_topic: String,
    /// Prefix cache capacity in blocks.
    #[arg(long, default_value_t = 4096)]
    cache_blocks: usize,
    /// Tokens per block (must equal the router's).
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Model name served (default: warmpath-tiny, or the folder's name).
    #[arg(long)]
    model_name: Option<String>,
    /// Requests that may wait; more are answered 503.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Longest prefill step in tokens.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// max_tokens when a request gives none.
    #[arg(long, default_value_t = 16)]
    default_max_tokens: usize,
    /// cpu, cuda or cuda:N (CUDA needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    dtype: String,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(cli))
}

fn write_model(cli: &Cli, dir: &std::path::Path) -> Result<()> {
    let size = cli.random_size.unwrap_or(SizePreset::Tiny);
    let options = ModelDirOptions {
        seed: cli.seed,
        dtype: parse_dtype(&cli.dtype)?,
        shards: cli.shards,
    };
    write_random_model_dir(dir, &size.config(), &options)
        .with_context(|| format!("writing a model folder to {}", dir.display()))?;
    println!(
        "wrote {size:?} model (seed {}) to {}",
        cli.seed,
        dir.display()
    );
    Ok(())
}

async fn serve(cli: Cli) -> Result<()> {
    if let Some(dir) = &cli.write_model_dir {
        return write_model(&cli, dir);
    }
    let source = match (&cli.model_dir, &cli.random_shape, &cli.random_size, cli.tiny) {
        (Some(d), None, None, false) => ModelSource::Dir(d.clone()),
        (None, Some(c), None, false) => ModelSource::RandomShape {
            config: c.clone(),
            seed: cli.seed,
        },
        (None, None, size, tiny) if size.is_some() != tiny => ModelSource::Random {
            size: size.unwrap_or(SizePreset::Tiny),
            seed: cli.seed,
        },
        _ => bail!(
            "give exactly one of --tiny, --model-dir DIR, --random-size SIZE or --random-shape CONFIG"
        ),
    };
    let Some(listen) = cli.listen.clone() else {
        bail!("--listen ADDRESS is required to serve");
    };
    // Both checked before the (slow) model load.
    let device = open_device(&cli.device)?;
    let dtype = parse_dtype(&cli.dtype)?;
    let model_name = cli.model_name.clone().unwrap_or_else(|| match &source {
        ModelSource::Dir(d) => d
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned()),
        _ => "warmpath-tiny".into(),
    });
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let loaded = tokio::task::block_in_place(|| load(&source, &device, dtype))
        .with_context(|| format!("loading {source:?}"))?;
    let max_model_len = loaded.model.config().max_position_embeddings;
    let options = EngineOptions {
        block_size: cli.block_size,
        cache_blocks: cli.cache_blocks,
        prefill_chunk: cli.prefill_chunk,
    };
    let sink = start_events(&cli).await?;
    let engine = Engine::new(loaded.model, options, sink)?;
    let (handle, thread) = worker::spawn(engine, cli.max_queue)?;
    let state = AppState {
        engine: handle,
        tokenizer: Arc::new(loaded.tokenizer),
        stop_ids: loaded.stop_ids,
        config: ServerConfig {
            model_name: model_name.clone(),
            max_model_len,
            block_size: cli.block_size,
            cache_blocks: cli.cache_blocks,
            default_max_tokens: cli.default_max_tokens,
        },
        prometheus: Some(prometheus),
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    println!("listening on http://{addr}");
    tracing::info!(%addr, model = %model_name, block_size = cli.block_size, cache_blocks = cli.cache_blocks, "serving");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving HTTP")?;
    // The router (and with it every engine handle) is gone: the worker ends.
    tokio::task::block_in_place(|| thread.join());
    Ok(())
}

/// Binds the KV event publisher when `--kv-events` is given.
#[cfg(feature = "kv-events")]
async fn start_events(cli: &Cli) -> Result<Box<dyn EventSink>> {
    let (sink, bound) = warmpath_engine::events::start(
        cli.kv_events.as_deref(),
        cli.kv_replay.as_deref(),
        &cli.kv_topic,
    )
    .await
    .context("starting the KV event publisher")?;
    if let Some(b) = &bound {
        println!("kv events on {}", b.events);
        if let Some(r) = &b.replay {
            println!("kv replay on {r}");
        }
    }
    Ok(sink)
}

/// Without the `kv-events` feature there is no publisher.
#[cfg(not(feature = "kv-events"))]
async fn start_events(cli: &Cli) -> Result<Box<dyn EventSink>> {
    if cli.kv_events.is_some() {
        bail!("--kv-events needs a build with the `kv-events` feature");
    }
    Ok(Box::new(warmpath_engine::NoEvents))
}
