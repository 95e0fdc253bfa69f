//! `warmpath-bench`: a thin command-line shell over the library.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use warmpath_bench::compare::candle::CandleConfig;
use warmpath_bench::compare::{self, CompareConfig, EngineKind, RouterKnobs};
use warmpath_bench::scale::{self, ScaleConfig};
use warmpath_bench::sim::{self, Fleet, SimConfig};
use warmpath_bench::timing::TimeModel;
use warmpath_bench::workload::{WorkloadKind, WorkloadSpec};
use warmpath_core::policy::KvConfig;
use warmpath_core::tokenize::ChatTokenizer;
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

// Parsed once at start-up: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Discrete-event simulation of a large fleet (no sockets).
    Scale(ScaleArgs),
    /// Runs a fleet of simulated vLLM instances until Ctrl-C.
    Sim(SimArgs),
    /// Replays one trace per strategy through simulated instances, agents and the router.
    Compare(CompareArgs),
    /// The one-command demo: 4 instances, `long`, every strategy, a report.
    Demo {
        /// A few seconds in all: small prompts, short runs, no rate search (for CI).
        #[arg(long)]
        quick: bool,
    },
}

#[derive(Args, Debug)]
struct CompareArgs {
    #[command(flatten)]
    config: CompareConfig,
    /// Workload (docs/bench.md describes each).
    #[arg(long, value_enum, default_value_t = WorkloadKind::Long)]
    workload: WorkloadKind,
    /// Strategies (comma separated) or `all`.
    #[arg(long, default_value = "all")]
    strategies: String,
    /// Rates of the goodput search, comma separated ("" for none).
    #[arg(long, default_value = "16,24,32")]
    search_rates: String,
    /// Documents / conversations / files of the workload (default: 16 per instance).
    #[arg(long)]
    docs: Option<usize>,
    /// Zipf exponent of prefix popularity.
    #[arg(long, default_value_t = 0.6)]
    zipf: f64,
    /// Tokens of the shared prefix (workload default when absent).
    #[arg(long)]
    prefix_tokens: Option<usize>,
    /// Output tokens per request.
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
    /// RNG seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Engines: `sim` (simulated vLLM) or `candle` (warmpath-engine --tiny processes).
    #[arg(long, default_value = "sim")]
    engine: String,
    /// The warmpath-engine binary for `--engine candle` (default: beside this one).
    #[arg(long)]
    engine_bin: Option<PathBuf>,
    /// `--engine candle`: longest prefill step in tokens.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    #[command(flatten)]
    kv: KvArgs,
}

impl CompareArgs {
    fn config(&self) -> anyhow::Result<CompareConfig> {
        let mut c = self.config.clone();
        let mut workload = WorkloadSpec::new(self.workload);
        workload.seed = self.seed;
        workload.zipf = self.zipf;
        workload.max_tokens = self.max_tokens;
        workload.docs = self.docs.unwrap_or(16 * c.instances.max(1));
        if let Some(p) = self.prefix_tokens {
            workload.prefix_tokens = p;
        }
        c.search_rates = (self.search_rates.split(',').map(str::trim))
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().with_context(|| format!("--search-rates: {s:?}")))
            .collect::<anyhow::Result<Vec<f64>>>()?;
        c.engine = match self.engine.as_str() {
            "sim" => EngineKind::Sim,
            "candle" => EngineKind::Candle(CandleConfig::new(
                self.engine_bin.as_deref(),
                self.prefill_chunk,
            )?),
            other => anyhow::bail!("--engine {other:?}: expected sim or candle"),
        };
        self.kv.apply(&mut c.router.kv);
        if let Some(a) = &c.attach {
            c.instances = a.engines.len();
        }
        c.workload = workload;
        c.strategies = strategies(&self.strategies)?;
        Ok(c)
    }
}

async fn run_compare(cfg: CompareConfig) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("stopping...");
            c.cancel();
        }
    });
    let engines = match cfg.engine {
        EngineKind::Sim => "simulated instances",
        EngineKind::Candle(_) => "warmpath-engine (candle) processes",
    };
    let what = match &cfg.attach {
        Some(a) => format!("router {} with {} engines", a.router_url, a.engines.len()),
        None => format!(
            "{} {engines} + agents + {} on 127.0.0.1",
            cfg.instances,
            routers(&cfg.router)
        ),
    };
    let source = match &cfg.trace {
        Some(p) => p.display().to_string(),
        None => format!("{:?}", cfg.workload.kind).to_lowercase(),
    };
    let (rate, secs) = (cfg.rate, cfg.duration_s);
    println!("warmpath-bench: {what}; {source} at {rate} req/s for {secs} s per strategy");
    let out = compare::run(&cfg, cancel).await?;
    println!("\n{}", out.table);
    if out.replicas.len() > 1 {
        for (i, r) in out.replicas.iter().enumerate() {
            let n = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
            let (url, sent, got) = (&r.url, n(r.facts_sent), n(r.facts_received));
            let (requests, ok) = (r.requests, r.served);
            println!("router {i} {url}: {requests} requests ({ok} ok), decision facts sent {sent}, received {got}");
        }
    }
    println!("report: {}", out.html.display());
    Ok(())
}

/// `router`, `router process` or `3 router processes (sharing decisions)`.
fn routers(k: &RouterKnobs) -> String {
    let sharing = if k.share_decisions { "" } else { "not " };
    match (k.as_processes(), k.routers) {
        (false, _) => "router".to_owned(),
        (true, 1) => "router process".to_owned(),
        (true, n) => format!("{n} router processes ({sharing}sharing decisions)"),
    }
}

fn demo_config(quick: bool) -> anyhow::Result<CompareConfig> {
    let mut c = CompareOnly::parse_from(["compare"]).args.config()?;
    // 20 s runs and three 6 s steps at most per strategy: the whole demo,
    // build included, fits README's 8 minutes on two cores.
    c.duration_s = 20.0;
    c.search_step_s = 6.0;
    if quick {
        c.duration_s = 3.0;
        c.rate = 6.0;
        c.workload.prefix_tokens = 1000;
        c.workload.docs = 8;
        c.workload.max_tokens = 8;
        c.search_rates.clear();
        c.sim.time = TimeModel::default().scaled(4.0);
    }
    Ok(c)
}

#[derive(Parser, Debug)]
#[command(name = "compare")]
struct CompareOnly {
    #[command(flatten)]
    args: CompareArgs,
}

#[derive(Args, Debug)]
struct SimArgs {
    /// Simulated instances.
    #[arg(long, default_value_t = 4)]
    instances: usize,
    /// A tokenizer.json or model folder (default: the generated tiny tokenizer).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    #[command(flatten)]
    config: SimConfig,
}

async fn run_sim(a: SimArgs) -> anyhow::Result<()> {
    let (cfg, shutdown) = (a.config, CancellationToken::new());
    let tokenizer = match &a.tokenizer {
        Some(p) => {
            Arc::new(ChatTokenizer::load(p).with_context(|| format!("loading {}", p.display()))?)
        }
        None => sim::tiny_tokenizer()?,
    };
    let fleet = Fleet::start(a.instances, &cfg, tokenizer, shutdown.clone()).await?;
    println!(
        "{} simulated vLLM instances of model {:?}:",
        fleet.instances.len(),
        cfg.model
    );
    for i in &fleet.instances {
        println!(
            "  {}  http {}  kv-events {}  replay {}",
            i.id,
            i.url,
            i.kv_events,
            i.kv_replay.as_deref().unwrap_or("-")
        );
    }
    println!("Ctrl-C to stop.");
    tokio::signal::ctrl_c().await?;
    shutdown.cancel();
    Ok(())
}

#[derive(Args, Debug)]
struct ScaleArgs {
    #[command(flatten)]
    config: ScaleConfig,
    /// Strategies to run (comma separated), or `all`.
    #[arg(long, default_value = "all")]
    strategy: String,
    /// Size the caches instead to hold this multiple of the working set.
    #[arg(long)]
    cache_ratio: Option<f64>,
    /// Print each instance's share of the requests (above 64 instances: how many are outside 0.5x-1.5x of an even share).
    #[arg(long)]
    shares: bool,
    /// Write the reports as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    kv: KvArgs,
}

fn strategies(list: &str) -> anyhow::Result<Vec<Strategy>> {
    if list == "all" {
        return Ok(Strategy::ALL.to_vec());
    }
    list.split(',')
        .map(|s| s.trim().parse::<Strategy>().map_err(anyhow::Error::from))
        .collect()
}

/// The kv_aware knobs `compare` and `scale` share (the router's `kv.*`).
#[derive(Args, Debug)]
struct KvArgs {
    /// kv_aware: `kv.rebalance_slack`, a number or `off`.
    #[arg(long, value_parser = slack)]
    rebalance_slack: Option<Slack>,
}

/// A `kv.rebalance_slack` (`None`: off); an alias, so clap takes it whole.
type Slack = Option<f64>;

fn slack(s: &str) -> Result<Slack, String> {
    match s {
        "off" => Ok(None),
        n => n
            .parse()
            .map(Some)
            .map_err(|_| "expected a number or off".into()),
    }
}

impl KvArgs {
    /// Lays the knobs given over `kv`.
    fn apply(&self, kv: &mut KvConfig) {
        if let Some(s) = self.rebalance_slack {
            kv.rebalance_slack = s;
        }
    }
}

fn run_scale(a: ScaleArgs) -> anyhow::Result<()> {
    let mut cfg = match a.cache_ratio {
        Some(r) => a.config.with_cache_ratio(r),
        None => a.config,
    };
    a.kv.apply(&mut cfg.policy.kv);
    let mut reports = Vec::new();
    let (n, blocks) = (cfg.instances, cfg.cache_blocks);
    let ws = (blocks * n) as f64 / cfg.working_set_blocks().max(1) as f64;
    let rate = cfg.rate_per_instance * n as f64;
    println!(
        "scale: {n} instances, {} router(s), {} requests per strategy, {} docs x {} tokens, cache {blocks} blocks each ({ws:.2}x the working set), {rate:.0} req/s",
        cfg.routers, cfg.requests, cfg.docs, cfg.doc_tokens
    );
    println!(
        "| strategy | hit rate | TTFT p50 ms | p90 | p99 | share min % | max % | decisions/s | routing µs | routing p50 / p99 µs | wall s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for s in strategies(&a.strategy)? {
        let total = cfg.requests;
        let r = scale::run(&cfg, s, &mut |done| {
            eprint!("\r{s}: {done}/{total}   ");
        })?;
        eprintln!();
        let hit = warmpath_bench::optimum::cell(r.hit_rate, None, r.optimum);
        let (t, d) = (r.ttft_ms, r.routing_dist_us);
        let (lo, hi) = (r.share_min_pct, r.share_max_pct);
        println!(
            "| {} | {hit} | {:.1} | {:.1} | {:.1} | {lo:.3} | {hi:.3} | {:.0} | {:.1} | {:.1} / {:.1} | {:.1} |",
            r.strategy, t.p50, t.p90, t.p99, r.decisions_per_s, r.routing_us, d.p50, d.p99, r.wall_s
        );
        println!("  {}", r.routing_cost.line());
        if a.shares && r.served.len() > 64 {
            let (below, above) = warmpath_bench::stats::outside_even(&r.served, 0.5, 1.5);
            let (late_below, late_above) =
                warmpath_bench::stats::outside_even(&r.served_late, 0.5, 1.5);
            let (late_min, late_max) = warmpath_bench::stats::share_min_max(&r.served_late);
            println!(
                "  shares: {below} instances below 0.5x an even share, {above} above 1.5x; \
                 second half of the requests: {late_below} below, {late_above} above, {late_min:.3}-{late_max:.3}%"
            );
        } else if a.shares {
            let pct: Vec<String> = r
                .served
                .iter()
                .map(|&n| format!("{:.2}", 100.0 * n as f64 / r.requests.max(1) as f64))
                .collect();
            println!("  shares %: {}", pct.join(" "));
        }
        if let Some(d) = &r.diagnosis {
            for line in d.lines() {
                println!("  {line}");
            }
        }
        reports.push(r);
    }
    println!("\n{}", warmpath_bench::optimum::LEGEND);
    if let Some(path) = a.json {
        let text = serde_json::to_string_pretty(&reports)?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Scale(a) => tokio::task::block_in_place(|| run_scale(a)),
        Command::Sim(a) => run_sim(a).await,
        Command::Compare(a) => run_compare(a.config()?).await,
        Command::Demo { quick } => run_compare(demo_config(quick)?).await,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_bench::compare::EngineEndpoint;

    #[test]
    fn compare_parses_with_and_without_an_attached_fleet() {
        let demo = demo_config(true).unwrap();
        assert!(demo.attach.is_none() && demo.search_rates.is_empty());
        let args = [
            "compare",
            "--attach-router",
            "http://r:1",
            "--attach-engine",
        ];
        let parsed = CompareOnly::try_parse_from(args.iter().chain(&["e0=http://e:2/,http://e:3"]));
        let a = parsed.unwrap().args.config.attach.unwrap();
        let e = |id: &str, url: &str| EngineEndpoint {
            id: id.into(),
            url: url.into(),
        };
        assert_eq!(a.engines, [e("e0", "http://e:2"), e("", "http://e:3")]);
        assert!(CompareOnly::try_parse_from(["compare", "--attach-engine", "x"]).is_err());
        assert!(CompareOnly::try_parse_from(["compare", "--admin-token", "t"]).is_err());
    }
}
