//! Prefill benchmark of the engine: time to first token (prefix lookup, prefill,
//! the first greedy token read back; no HTTP) with an empty cache versus a prefix
//! an earlier request with another suffix computed. GPU: `--features cuda`, then
//! `--device cuda --dtype bf16 --size 1b --prefix 8000 --json`.

use anyhow::Result;
use clap::{Parser, ValueEnum};
use serde_json::json;
use std::time::Instant;
use warmpath_engine::device::{open_device, parse_dtype};
use warmpath_engine::engine::argmax;
use warmpath_engine::{load, Engine, EngineOptions, ModelSource, NoEvents, SizePreset};

#[derive(Debug, Parser)]
#[command(name = "warmpath-engine-bench", about)]
struct Args {
    /// Shared prefix lengths in tokens, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1000usize, 4000])]
    prefix: Vec<usize>,
    /// Tokens after the prefix (different for every request).
    #[arg(long, default_value_t = 32)]
    suffix: usize,
    /// Measurements per setting (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// Random-weight model shape: tiny (4 layers, width 256) or 1b (Llama 3.2 1B's shape).
    #[arg(long, default_value = "tiny", value_parser = ["tiny", "1b"])]
    size: String,
    /// cpu, cuda or cuda:N (CUDA needs `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// f32, f16 or bf16 (bf16 only on CUDA).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Print one JSON line instead of a Markdown table.
    #[arg(long)]
    json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse();
    let size = SizePreset::from_str(&args.size, false).map_err(anyhow::Error::msg)?;
    let device = open_device(&args.device)?;
    let dtype = parse_dtype(&args.dtype)?;
    let t = Instant::now();
    let loaded = load(&ModelSource::Random { size, seed: 0 }, &device, dtype)?;
    let load_seconds = t.elapsed().as_secs_f64();
    let cfg = loaded.model.config().clone();
    let vocab = cfg.vocab_size as u64;
    let max = args.prefix.iter().max().copied().unwrap_or(0) + args.suffix;
    let opts = EngineOptions {
        block_size: args.block_size,
        cache_blocks: 2 * max / args.block_size.max(1) + 16,
        prefill_chunk: args.prefill_chunk,
    };
    let mut engine = Engine::new(loaded.model, opts, Box::new(NoEvents))?;
    // Deterministic pseudo-random token ids (the model does not care about meaning).
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % vocab) as u32
    };
    let warmup: Vec<u32> = (0..64).map(|_| next()).collect();
    // Untimed: loads kernels and warms allocators.
    argmax(&engine.prefill(&warmup, None)?.logits)?;
    let mut results = Vec::new();
    for &plen in &args.prefix {
        let (mut cold, mut warm, mut cached) = (Vec::new(), Vec::new(), 0);
        for _ in 0..args.runs.max(1) {
            engine.reset_cache()?;
            let prefix: Vec<u32> = (0..plen).map(|_| next()).collect();
            let mut prompt = |n: usize| -> Vec<u32> {
                prefix
                    .iter()
                    .copied()
                    .chain((0..n).map(|_| next()))
                    .collect()
            };
            let (a, b) = (prompt(args.suffix), prompt(args.suffix));
            let t = Instant::now();
            let p = engine.prefill(&a, None)?;
            argmax(&p.logits)?;
            cold.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let p = engine.prefill(&b, None)?;
            argmax(&p.logits)?;
            warm.push(t.elapsed().as_secs_f64());
            cached = p.cached_tokens;
        }
        let (c, w) = (median(cold), median(warm));
        results.push(json!({
            "prefix": plen,
            "suffix": args.suffix,
            "cold_ttft_ms": (c * 1e4).round() / 10.0,
            "warm_ttft_ms": (w * 1e4).round() / 10.0,
            "speedup": (c / w * 10.0).round() / 10.0,
            "cold_prefill_tok_s": ((plen + args.suffix) as f64 / c).round(),
            "cached_tokens": cached,
        }));
    }
    if args.json {
        let line = json!({
            "bench": "warmpath-engine-bench",
            "size": args.size,
            "params": cfg.num_params(),
            "device": args.device,
            "dtype": args.dtype,
            "block_size": args.block_size,
            "prefill_chunk": args.prefill_chunk,
            "runs": args.runs.max(1),
            "load_seconds": (load_seconds * 100.0).round() / 100.0,
            "results": results,
        });
        println!("{line}");
        return Ok(());
    }
    println!(
        "{} model ({} parameters) on {} in {}, block {}, prefill chunk {}, median of {} runs",
        args.size,
        cfg.num_params(),
        args.device,
        args.dtype,
        args.block_size,
        args.prefill_chunk,
        args.runs.max(1)
    );
    println!("| shared prefix | suffix | cold TTFT ms | warm TTFT ms | speed-up | cold prefill tok/s | cached tokens |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in &results {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1}x | {} | {} |",
            r["prefix"],
            r["suffix"],
            r["cold_ttft_ms"].as_f64().unwrap_or_default(),
            r["warm_ttft_ms"].as_f64().unwrap_or_default(),
            r["speedup"].as_f64().unwrap_or_default(),
            r["cold_prefill_tok_s"],
            r["cached_tokens"],
        );
    }
    Ok(())
}
