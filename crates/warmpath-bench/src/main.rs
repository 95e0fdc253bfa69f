//! `warmpath-bench`: a thin command-line shell over the library.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use warmpath_bench::scale::{self, ScaleConfig};
use warmpath_bench::workload::{self, WorkloadKind, WorkloadSpec};
use warmpath_core::Strategy;

#[derive(Parser, Debug)]
#[command(
    name = "warmpath-bench",
    version,
    about = "warmpath benchmarks and demo"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Discrete-event simulation of a large fleet (no sockets).
    Scale(ScaleArgs),
    /// Writes a generated workload as a JSONL trace.
    Trace(TraceArgs),
}

#[derive(Args, Debug)]
struct ScaleArgs {
    /// Simulated instances.
    #[arg(long, default_value_t = 1000)]
    instances: usize,
    /// Requests per strategy.
    #[arg(long, default_value_t = 1_000_000)]
    requests: usize,
    /// Strategies to run (comma separated), or `all`.
    #[arg(long, default_value = "all")]
    strategy: String,
    /// Mean arrivals per second per instance.
    #[arg(long, default_value_t = 4.0)]
    rate_per_instance: f64,
    /// Distinct documents.
    #[arg(long, default_value_t = 8000)]
    docs: usize,
    /// Zipf exponent of document popularity.
    #[arg(long, default_value_t = 0.8)]
    zipf: f64,
    /// Tokens per document.
    #[arg(long, default_value_t = 8000)]
    doc_tokens: usize,
    /// Prefix cache capacity per instance, in blocks.
    #[arg(long, default_value_t = 8192)]
    cache_blocks: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Write the reports as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct TraceArgs {
    /// Workload: long, short, rag, code, tenants.
    #[arg(long, default_value = "long")]
    workload: WorkloadKind,
    /// Requests.
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// Mean arrivals per second.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
}

fn strategies(list: &str) -> anyhow::Result<Vec<Strategy>> {
    if list == "all" {
        return Ok(Strategy::ALL.to_vec());
    }
    list.split(',')
        .map(|s| s.trim().parse::<Strategy>().map_err(anyhow::Error::from))
        .collect()
}

fn run_scale(a: ScaleArgs) -> anyhow::Result<()> {
    let cfg = ScaleConfig {
        instances: a.instances,
        requests: a.requests,
        rate_per_instance: a.rate_per_instance,
        docs: a.docs,
        zipf: a.zipf,
        doc_tokens: a.doc_tokens,
        cache_blocks: a.cache_blocks,
        seed: a.seed,
        ..Default::default()
    };
    let mut reports = Vec::new();
    println!(
        "scale: {} instances, {} requests per strategy, {} docs x {} tokens, {:.0} req/s",
        cfg.instances,
        cfg.requests,
        cfg.docs,
        cfg.doc_tokens,
        cfg.rate_per_instance * cfg.instances as f64
    );
    println!(
        "| strategy | hit rate | TTFT p50 ms | p90 | p99 | share min % | max % | decisions/s | routing µs | wall s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for s in strategies(&a.strategy)? {
        let total = cfg.requests;
        let r = scale::run(&cfg, s, &mut |done| {
            eprint!("\r{s}: {done}/{total}   ");
        })?;
        eprintln!();
        println!(
            "| {} | {:.1}% | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.0} | {:.1} | {:.1} |",
            r.strategy,
            100.0 * r.hit_rate,
            r.ttft_ms.p50,
            r.ttft_ms.p90,
            r.ttft_ms.p99,
            r.share_min_pct,
            r.share_max_pct,
            r.decisions_per_s,
            r.routing_us,
            r.wall_s
        );
        reports.push(r);
    }
    if let Some(path) = a.json {
        let text = serde_json::to_string_pretty(&reports)?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Scale(a) => run_scale(a),
        Command::Trace(a) => {
            let spec = WorkloadSpec {
                requests: a.requests,
                rate: a.rate,
                seed: a.seed,
                ..WorkloadSpec::new(a.workload)
            };
            let trace = workload::generate(&spec)?;
            workload::trace::write(&a.out, &trace)?;
            println!("wrote {} requests to {}", trace.len(), a.out.display());
            Ok(())
        }
    }
}
