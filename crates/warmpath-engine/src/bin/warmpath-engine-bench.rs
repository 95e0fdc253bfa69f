//! Prefill benchmark of the tiny engine: time to first token with a cold cache
//! versus a warm shared prefix, and prefill throughput.
//!
//! `cargo run --release -p warmpath-engine --bin warmpath-engine-bench -- [--prefix 1000,4000] [--suffix 32] [--runs 3]`
//!
//! TTFT here is measured inside the engine (prefix lookup + prefill + the
//! first greedy token), without HTTP. Cold: empty cache. Warm: the same
//! prefix was computed by an earlier request with a different suffix.

use anyhow::Result;
use candle_core::{DType, Device};
use clap::Parser;
use std::time::Instant;
use warmpath_engine::engine::argmax;
use warmpath_engine::{load, Engine, EngineOptions, ModelSource, NoEvents};

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
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Prefill chunk.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse();
    let loaded = load(&ModelSource::Tiny { seed: 0 }, &Device::Cpu, DType::F32)?;
    let vocab = loaded.model.config().vocab_size as u64;
    let max = args.prefix.iter().max().copied().unwrap_or(0) + args.suffix;
    let opts = EngineOptions {
        block_size: args.block_size,
        cache_blocks: 2 * max / args.block_size + 16,
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
    println!("| shared prefix | suffix | cold TTFT ms | warm TTFT ms | speed-up | cold prefill tok/s | cached tokens |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
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
        println!(
            "| {plen} | {} | {:.1} | {:.1} | {:.1}x | {:.0} | {cached} |",
            args.suffix,
            c * 1e3,
            w * 1e3,
            c / w,
            (plen + args.suffix) as f64 / c
        );
    }
    Ok(())
}
