//! `warmpath-bench compare` and the demo: the same trace once per strategy
//! against one stack ([`stack`]), caches reset between strategies: a main
//! open-loop run, then a rate search for the goodput (docs/bench.md).

mod bound;
pub mod candle;
mod child;
pub mod driver;
mod plot;
pub mod replicas;
pub mod report;
pub mod stack;

use crate::error::{ensure, ensure_in, io, BenchError};
use crate::sim::SimConfig;
use crate::workload::{self, rescale, TraceRequest, WorkloadSpec};
use driver::{drive, DriveConfig};
use indicatif::{ProgressBar, ProgressStyle};
use report::{aggregate, markdown, RatePoint, StrategyReport};
use serde::Serialize;
pub use stack::{AttachConfig, EngineEndpoint, EngineKind, RouterKnobs, Stack};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use warmpath_core::Strategy;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct CompareConfig {
    /// Simulated instances (ignored when attaching).
    #[arg(long, default_value_t = 4)]
    pub instances: usize,
    #[command(flatten)]
    pub sim: SimConfig,
    #[arg(skip = EngineKind::Sim)]
    pub engine: EngineKind,
    #[command(flatten)]
    pub attach: Option<AttachConfig>,
    /// The workload (ignored when `trace` is given).
    #[arg(skip = WorkloadSpec::new(crate::workload::WorkloadKind::Long))]
    pub workload: WorkloadSpec,
    /// Replay this JSONL trace instead of a generated workload.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Strategies, in run order.
    #[arg(skip)]
    pub strategies: Vec<Strategy>,
    /// Seconds of the main run per strategy.
    #[arg(long = "duration", default_value_t = 30.0)]
    pub duration_s: f64,
    /// Offered rate of the main run, req/s.
    #[arg(long, default_value_t = 8.0)]
    pub rate: f64,
    /// Rates of the goodput search (empty: no search).
    #[arg(skip)]
    pub search_rates: Vec<f64>,
    /// Seconds per search step.
    #[arg(long = "search-step", default_value_t = 8.0)]
    pub search_step_s: f64,
    /// TTFT SLO of the goodput search (P90), ms.
    #[arg(long, default_value_t = 500.0)]
    pub slo_ms: f64,
    /// Ask the router's index before every n-th request (0: never).
    #[arg(long, default_value_t = 2)]
    pub fidelity_every: usize,
    #[command(flatten)]
    pub router: RouterKnobs,
    /// Output folder.
    #[arg(long = "out", default_value = "warmpath-report")]
    pub out_dir: PathBuf,
    /// No progress bars.
    #[arg(long = "quiet", action = clap::ArgAction::SetFalse)]
    pub progress: bool,
}

#[derive(Debug)]
pub struct CompareOutcome {
    pub reports: Vec<StrategyReport>,
    /// The console's table (at most 120 columns; the full one is in the report).
    pub table: String,
    pub html: PathBuf,
    /// Per router replica (one entry for a single router).
    pub replicas: Vec<ReplicaSummary>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplicaSummary {
    /// Its `http://` base URL.
    pub url: String,
    /// Requests sent to it.
    pub requests: u64,
    /// Those it answered without failure.
    pub served: u64,
    /// Decision facts it sent (`None`: not read).
    pub facts_sent: Option<f64>,
    /// Facts of other replicas it received through the agents.
    pub facts_received: Option<f64>,
}

impl CompareConfig {
    fn validate(&self) -> Result<(), BenchError> {
        let routers = self.router.routers;
        ensure_in("instances", self.instances, 256)?;
        ensure_in("routers", routers, 16)?;
        let why = "replicas are started here: not with --attach-router";
        ensure(self.attach.is_none() || routers == 1, "routers", why)?;
        ensure(
            !self.strategies.is_empty(),
            "strategies",
            "name at least one",
        )?;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        for (what, v) in [
            ("duration", self.duration_s),
            ("rate", self.rate),
            ("slo", self.slo_ms),
        ] {
            ensure(positive(v), what, "must be a number > 0")?;
        }
        let search_ok =
            self.search_rates.iter().all(|&r| positive(r)) && positive(self.search_step_s);
        ensure(
            search_ok,
            "rate search",
            "rates and step length must be > 0",
        )?;
        Ok(())
    }

    fn base_trace(&self) -> Result<Vec<TraceRequest>, BenchError> {
        match &self.trace {
            Some(p) => workload::trace::read(p),
            None => {
                let spec = WorkloadSpec {
                    rate: self.rate,
                    requests: ((self.rate * self.duration_s).ceil() as usize).max(1),
                    model: self.sim.model.clone(),
                    ..self.workload.clone()
                };
                workload::generate(&spec)
            }
        }
    }
}

/// The progress bars' labels: which strategy of how many, and when all end.
struct Overall {
    show: bool,
    started: std::time::Instant,
    strategies: usize,
    /// The planned seconds of one strategy (main run and rate search).
    planned_s: f64,
}

impl Overall {
    fn new(cfg: &CompareConfig) -> Self {
        Overall {
            show: cfg.progress,
            started: std::time::Instant::now(),
            strategies: cfg.strategies.len(),
            planned_s: cfg.duration_s + cfg.search_rates.len() as f64 * cfg.search_step_s,
        }
    }

    /// `[k+1/n] what, all done in ~ETA`, measured on the strategies done.
    fn label(&self, k: usize, what: &str) -> String {
        let left = (self.strategies - k.min(self.strategies)) as f64;
        let per = match k {
            0 => self.planned_s,
            _ => self.started.elapsed().as_secs_f64() / k as f64,
        };
        let (n, of, eta) = (k + 1, self.strategies, clock(per * left));
        format!("[{n}/{of}] {what}, all done in ~{eta}")
    }

    /// A progress bar of `len` requests for strategy `k`, labelled as [`Self::label`].
    fn bar(&self, k: usize, len: usize, what: &str) -> ProgressBar {
        if !self.show {
            return ProgressBar::hidden();
        }
        let style = ProgressStyle::with_template("{prefix} [{bar:24}] {pos}/{len} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let pb = ProgressBar::new(len as u64).with_style(style);
        pb.set_prefix(self.label(k, what));
        pb
    }
}

/// `1h02m`, `3m05s`, `42s`.
fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

pub async fn run(
    cfg: &CompareConfig,
    cancel: CancellationToken,
) -> Result<CompareOutcome, BenchError> {
    cfg.validate()?;
    let base = cfg.base_trace()?;
    let stack = match &cfg.attach {
        Some(a) => Stack::attach(a, &cfg.sim.model).await?,
        None => {
            Stack::start(
                cfg.instances,
                &cfg.sim,
                &cfg.engine,
                cfg.strategies[0],
                &cfg.router,
                None,
                cancel.clone(),
            )
            .await?
        }
    };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .build()
        .map_err(|e| stack::http(&stack.router_urls[0], e))?;
    let drive_cfg = DriveConfig {
        urls: stack.router_urls.clone(),
        spread_seed: cfg.workload.seed,
        fidelity_every: cfg.fidelity_every,
        timeout: Duration::from_secs(120),
        inspect_token: stack.admin_token.clone(),
    };
    let search_cfg = DriveConfig {
        fidelity_every: 0,
        ..drive_cfg.clone()
    };
    // An engine attached by bare URL has no id to count shares by.
    let ids: Vec<String> = (stack.engines.iter().filter(|e| !e.id.is_empty()))
        .map(|e| e.id.clone())
        .collect();
    let bs = cfg.sim.block_size as u64;
    let chains = crate::sim::tiny_tokenizer()
        .ok()
        .and_then(|tok| bound::chains(&base, &tok, cfg.sim.block_size));
    let fleet = crate::optimum::Fleet {
        backends: ids.len(),
        cache_blocks: cfg.sim.cache_blocks as u64,
        block_size: bs,
        max_in_flight: cfg.sim.time.max_batch as usize,
    };
    let mut reports = Vec::new();
    let mut served = vec![(0u64, 0u64); stack.router_urls.len()];
    let mut tally = |samples: &[driver::Sample]| {
        // A request cut off by Ctrl-C before it was sent has neither.
        let sent = samples
            .iter()
            .filter(|s| s.error.is_some() || s.e2e_ms.is_some());
        for s in sent {
            if let Some(n) = served.get_mut(s.replica) {
                n.0 += 1;
                n.1 += u64::from(s.error.is_none());
            }
        }
    };
    let overall = Overall::new(cfg);
    for (k, &s) in cfg.strategies.iter().enumerate() {
        if cancel.is_cancelled() {
            break;
        }
        stack.set_strategy(&client, s).await?;
        stack.reset_caches(&client).await?;
        tracing::info!(strategy = %s, "main run");
        let pb = overall.bar(k, base.len(), &format!("{s} @ {:.1} req/s", cfg.rate));
        let before = stack.engine_prefix_counters(&client).await;
        let samples = drive(&client, &drive_cfg, &base, &pb, &cancel).await;
        pb.finish();
        tally(&samples);
        let after = stack.engine_prefix_counters(&client).await;
        let mut r = aggregate(s.as_str(), cfg.rate, &samples, bs, &ids);
        r.hit_ceiling = report::hit_ceiling(&base, &samples, bs);
        r.optimum = chains
            .as_deref()
            .and_then(|c| bound::optimum(c, &samples, fleet));
        if let (Ok((q0, h0)), Ok((q1, h1))) = (before, after) {
            r.engine_hit_rate = (q1 > q0).then(|| (h1 - h0) / (q1 - q0));
        }
        for &rate in &cfg.search_rates {
            if cancel.is_cancelled() {
                break;
            }
            let n = ((rate * cfg.search_step_s).ceil() as usize).max(1);
            let step: Vec<TraceRequest> =
                rescale(&base, cfg.rate, rate).into_iter().take(n).collect();
            let pb = overall.bar(k, step.len(), &format!("{s} search @ {rate:.1} req/s"));
            let samples = drive(&client, &search_cfg, &step, &pb, &cancel).await;
            pb.finish();
            tally(&samples);
            let a = aggregate(s.as_str(), rate, &samples, bs, &ids);
            let ok = a.failures == 0 && a.ttft_ms.p90 <= cfg.slo_ms;
            r.rate_search.push(RatePoint {
                rate,
                ttft_p90_ms: a.ttft_ms.p90,
                failures: a.failures,
                ok,
            });
            if ok {
                r.goodput_rps = Some(r.goodput_rps.map_or(rate, |g: f64| g.max(rate)));
            }
        }
        reports.push(r);
    }
    let facts = stack.replica_facts(&client).await.ok();
    let replicas: Vec<ReplicaSummary> = stack
        .router_urls
        .iter()
        .zip(&served)
        .enumerate()
        .map(|(i, (url, &(requests, ok)))| ReplicaSummary {
            url: url.clone(),
            requests,
            served: ok,
            facts_sent: facts.as_ref().and_then(|f| f.get(i)).map(|f| f.0),
            facts_received: facts.as_ref().and_then(|f| f.get(i)).map(|f| f.1),
        })
        .collect();
    stack.shutdown().await;
    let settings = serde_json::to_value(cfg).unwrap_or_default();
    let html = write_all(&cfg.out_dir, &reports, &replicas, &settings, cfg.slo_ms)?;
    Ok(CompareOutcome {
        table: report::console(&reports, cfg.slo_ms),
        reports,
        html,
        replicas,
    })
}

/// Writes results.json, replicas.json, results.md, the SVG plots and report.html into
/// `dir`; returns the HTML report's path.
fn write_all(
    dir: &Path,
    reports: &[StrategyReport],
    replicas: &impl serde::Serialize,
    settings: &serde_json::Value,
    slo_ms: f64,
) -> Result<PathBuf, BenchError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let json = serde_json::json!({"settings": settings, "strategies": reports});
    let text = serde_json::to_string_pretty(&json).unwrap_or_default();
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).map_err(io(&p))
    };
    write("results.json", &text)?;
    let replicas = serde_json::to_string_pretty(replicas).unwrap_or_default();
    write("replicas.json", &replicas)?;
    let md = markdown(reports, slo_ms);
    write("results.md", &md)?;
    let cdf = plot::ttft_cdf(reports);
    let hits = plot::hit_over_time(reports);
    let shares = plot::shares(reports);
    write("ttft_cdf.svg", &cdf)?;
    write("hit_rate.svg", &hits)?;
    write("share.svg", &shares)?;
    let html = plot::html(&md, &[&cdf, &hits, &shares], &text);
    write("report.html", &html)?;
    Ok(dir.join("report.html"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::optimum::{Optimum, LEGEND};
    use driver::Sample;

    #[test]
    fn progress_labels_say_which_strategy_of_how_many_and_when_all_end() {
        let o = Overall {
            show: false,
            started: std::time::Instant::now(),
            strategies: 4,
            planned_s: 50.0,
        };
        assert_eq!(
            o.label(0, "random @ 8.0 req/s"),
            "[1/4] random @ 8.0 req/s, all done in ~3m20s"
        );
        assert!(o
            .label(3, "kv_aware")
            .starts_with("[4/4] kv_aware, all done in ~"));
        assert_eq!(
            (clock(42.4), clock(3725.0)),
            ("42s".to_owned(), "1h02m".to_owned())
        );
    }

    #[test]
    fn every_report_file_shows_the_bound_and_the_lru_references() {
        let samples: Vec<Sample> = (0..4)
            .map(|i| Sample {
                arrival_s: f64::from(i),
                done_s: f64::from(i) + 0.5,
                ttft_ms: Some(10.0),
                e2e_ms: Some(20.0),
                prompt_tokens: 100,
                cached_tokens: 48,
                completion_tokens: 4,
                backend: Some("sim-0".into()),
                ..Sample::default()
            })
            .collect();
        let mut r = aggregate("kv_aware", 1.0, &samples, 16, &["sim-0".into()]);
        r.hit_ceiling = Some(0.95);
        r.optimum = Some(Optimum {
            bound: 0.911,
            lru_oracle: Some(0.858),
        });
        let dir = std::env::temp_dir().join(format!("warmpath-report-{}", std::process::id()));
        write_all(
            &dir,
            &[r],
            &serde_json::json!([]),
            &serde_json::json!({}),
            500.0,
        )
        .unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let (md, html, svg) = (
            read("results.md"),
            read("report.html"),
            read("hit_rate.svg"),
        );
        let json: serde_json::Value = serde_json::from_str(&read("results.json")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        // The references once, above the table; the row has the hit rate.
        let refs = "ceiling 95.0%, bound 91.1%, LRU oracle 85.8%";
        assert!(
            md.starts_with("Hit-rate references") && md.contains(&format!("{refs}\n\n| strategy")),
            "{md}"
        );
        assert!(md.contains("| 48.0% |"), "{md}");
        assert!(md.trim_end().ends_with(LEGEND), "{md}");
        assert!(html.contains(&format!("{refs}</p>\n<table>")), "{html}");
        assert!(html.contains("<td>48.0%</td>"), "{html}");
        assert!(html.contains("<p>Hit-rate references"), "{html}");
        let o = &json["strategies"][0]["optimum"];
        assert_eq!(o["bound"], 0.911);
        assert_eq!(o["lru_oracle"], 0.858);
        for line in ["optimum bound", "LRU oracle"] {
            assert!(svg.contains(&format!(">{line}</text>")), "{line}: {svg}");
        }
    }
}
