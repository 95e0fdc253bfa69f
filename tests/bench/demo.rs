//! End to end: a quick comparison through simulated instances, real agents
//! and the real router on 127.0.0.1 (what `warmpath-bench demo --quick` runs).

use std::time::Duration;
use tokio_util::sync::CancellationToken;
use warmpath_bench::compare::{self, CompareConfig, EngineKind, RouterKnobs};
use warmpath_bench::sim::SimConfig;
use warmpath_bench::timing::TimeModel;
use warmpath_bench::workload::{WorkloadKind, WorkloadSpec};
use warmpath_core::Strategy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_comparison_routes_on_real_cache_state() {
    let out = std::env::temp_dir().join(format!("warmpath-bench-e2e-{}", std::process::id()));
    let cfg = CompareConfig {
        instances: 3,
        sim: SimConfig {
            time: TimeModel::default().scaled(4.0),
            cache_blocks: 2048,
            ..Default::default()
        },
        workload: WorkloadSpec {
            docs: 6,
            prefix_tokens: 600,
            max_tokens: 4,
            ..WorkloadSpec::new(WorkloadKind::Long)
        },
        engine: EngineKind::Sim,
        attach: None,
        trace: None,
        strategies: vec![Strategy::Random, Strategy::KvAware],
        duration_s: 4.0,
        rate: 6.0,
        search_rates: vec![12.0],
        search_step_s: 1.0,
        slo_ms: 10_000.0,
        fidelity_every: 1,
        router: RouterKnobs::default(),
        out_dir: out.clone(),
        progress: false,
    };
    let run = tokio::time::timeout(
        Duration::from_secs(120),
        compare::run(&cfg, CancellationToken::new()),
    );
    let outcome = run.await.unwrap().unwrap();
    assert_eq!(outcome.reports.len(), 2);
    for r in &outcome.reports {
        assert_eq!(r.failures, 0, "{}: {:?}", r.strategy, r);
        assert_eq!(r.requests, 24);
        assert_eq!(r.shares.len(), 3);
        assert_eq!(r.rate_search.len(), 1);
        assert!(r.ttft_ms.p50 > 0.0);
    }
    let kv = &outcome.reports[1];
    // Six documents, 24 requests: repeats exist, and kv_aware routes them to
    // the instance its agent reported as holding the document.
    assert!(
        kv.decisions.get("kv_match").copied().unwrap_or(0) > 0,
        "{:?}",
        kv.decisions
    );
    assert!(kv.hit_rate > 0.3, "{}", kv.hit_rate);
    let f = kv.fidelity.as_ref().unwrap();
    assert!(f.samples >= 20);
    for name in [
        "results.json",
        "results.md",
        "ttft_cdf.svg",
        "hit_rate.svg",
        "share.svg",
        "report.html",
    ] {
        assert!(out.join(name).exists(), "{name}");
    }
    let html = std::fs::read_to_string(&outcome.html).unwrap();
    assert!(html.contains("kv_aware") && html.contains("<svg"));
    std::fs::remove_dir_all(&out).unwrap();
}

/// `target/debug/warmpath-router`, beside this test's `deps/` folder.
fn router_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(std::path::Path::parent)
        .unwrap()
        .join("warmpath-router");
    assert!(
        bin.exists(),
        "{} is missing: `cargo test --workspace` builds it; alone, run `cargo build -p warmpath-router` first",
        bin.display()
    );
    bin
}

/// `compare --routers 2`: two real router processes behind the driver's
/// random spread, every agent streaming to both. Both replicas serve
/// traffic, each hears the other's decisions through the agents, kv_aware
/// still routes on the shared cache state, and the report is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_runs_router_replicas_as_processes() {
    let out = std::env::temp_dir().join(format!("warmpath-bench-replicas-{}", std::process::id()));
    let cfg = CompareConfig {
        instances: 2,
        sim: SimConfig {
            time: TimeModel::default().scaled(4.0),
            cache_blocks: 2048,
            ..Default::default()
        },
        workload: WorkloadSpec {
            docs: 4,
            prefix_tokens: 400,
            max_tokens: 4,
            ..WorkloadSpec::new(WorkloadKind::Long)
        },
        engine: EngineKind::Sim,
        attach: None,
        trace: None,
        strategies: vec![Strategy::KvAware],
        duration_s: 4.0,
        rate: 6.0,
        search_rates: vec![],
        search_step_s: 1.0,
        slo_ms: 10_000.0,
        fidelity_every: 1,
        router: RouterKnobs {
            routers: 2,
            router_bin: Some(router_binary()),
            ..RouterKnobs::default()
        },
        out_dir: out.clone(),
        progress: false,
    };
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        compare::run(&cfg, CancellationToken::new()),
    )
    .await
    .unwrap()
    .unwrap();
    let kv = &outcome.reports[0];
    assert_eq!(kv.failures, 0, "{kv:?}");
    assert_eq!(kv.requests, 24);
    assert!(
        kv.decisions.get("kv_match").copied().unwrap_or(0) > 0,
        "{kv:?}"
    );
    assert_eq!(outcome.replicas.len(), 2);
    let urls: std::collections::HashSet<_> = outcome.replicas.iter().map(|r| &r.url).collect();
    assert_eq!(urls.len(), 2, "{:?}", outcome.replicas);
    for r in &outcome.replicas {
        assert!(r.requests > 0 && r.served == r.requests, "{r:?}");
        // Three phases per request, passed on to the other replica.
        assert!(r.facts_sent.unwrap_or(0.0) >= r.requests as f64, "{r:?}");
        assert!(r.facts_received.unwrap_or(0.0) > 0.0, "{r:?}");
    }
    for name in ["results.json", "report.html", "replicas.json"] {
        assert!(out.join(name).exists(), "{name}");
    }
    // A wrong binary is refused with the command that builds it.
    let bad = CompareConfig {
        router: RouterKnobs {
            routers: 2,
            router_bin: Some("/nonexistent/warmpath-router".into()),
            ..RouterKnobs::default()
        },
        ..cfg
    };
    let err = compare::run(&bad, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("cargo build -p warmpath-router"),
        "{err}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// `n` simulated engines (time model 4x faster, `cache_blocks` each), their
/// agents and a router routing with `strategy`, all on 127.0.0.1.
async fn sim_stack(
    n: usize,
    cache_blocks: usize,
    strategy: Strategy,
    admin_token: Option<&str>,
    shutdown: &CancellationToken,
) -> (SimConfig, warmpath_bench::compare::Stack) {
    let sim = SimConfig {
        time: TimeModel::default().scaled(4.0),
        cache_blocks,
        ..Default::default()
    };
    let stack = warmpath_bench::compare::Stack::start(
        n,
        &sim,
        &EngineKind::Sim,
        strategy,
        &RouterKnobs::default(),
        admin_token.map(str::to_owned),
        shutdown.clone(),
    )
    .await
    .unwrap();
    (sim, stack)
}

/// Attach mode: the test starts a stack itself (simulated engines, agents and
/// a router whose admin API needs a token), then `compare` attaches to it by
/// URL only, switching the strategy through the admin API between runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_attaches_to_a_running_router_and_engines() {
    use warmpath_bench::compare::AttachConfig;
    let shutdown = CancellationToken::new();
    let (sim, stack) = sim_stack(2, 2048, Strategy::PrefixAware, Some("s3cret"), &shutdown).await;
    let out = std::env::temp_dir().join(format!("warmpath-bench-attach-{}", std::process::id()));
    let attach = |token: Option<&str>| AttachConfig {
        router_url: stack.router_urls[0].clone(),
        admin_token: token.map(str::to_owned),
        engines: stack.engines.clone(),
    };
    let cfg = CompareConfig {
        instances: 2,
        sim: sim.clone(),
        engine: EngineKind::Sim,
        attach: Some(attach(Some("s3cret"))),
        workload: WorkloadSpec {
            docs: 4,
            prefix_tokens: 400,
            max_tokens: 4,
            ..WorkloadSpec::new(WorkloadKind::Long)
        },
        trace: None,
        strategies: vec![Strategy::Random, Strategy::KvAware],
        duration_s: 3.0,
        rate: 6.0,
        search_rates: vec![],
        search_step_s: 1.0,
        slo_ms: 10_000.0,
        fidelity_every: 1,
        router: RouterKnobs::default(),
        out_dir: out.clone(),
        progress: false,
    };
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        compare::run(&cfg, CancellationToken::new()),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(outcome.reports.len(), 2);
    let (random, kv) = (&outcome.reports[0], &outcome.reports[1]);
    for r in [random, kv] {
        assert_eq!(r.failures, 0, "{r:?}");
        assert_eq!(r.requests, 18);
        // The engines' own /metrics agree there was traffic.
        assert!(r.engine_hit_rate.is_some(), "{r:?}");
    }
    // The switch took effect: the router's decision headers follow it.
    assert_eq!(random.decisions.keys().collect::<Vec<_>>(), ["random"]);
    assert!(!kv.decisions.contains_key("random"), "{:?}", kv.decisions);
    assert!(kv.decisions.get("kv_match").copied().unwrap_or(0) > 0);
    assert!(
        kv.hit_rate > random.hit_rate,
        "{} vs {}",
        kv.hit_rate,
        random.hit_rate
    );

    // Without the token the admin switch is refused, and compare says so.
    let bad = CompareConfig {
        attach: Some(attach(None)),
        ..cfg.clone()
    };
    let err = compare::run(&bad, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("strategy"), "{err}");
    // A dead engine URL fails the attach health check.
    let mut dead = attach(Some("s3cret"));
    dead.engines[0].url = "http://127.0.0.1:1".into();
    let bad = CompareConfig {
        attach: Some(dead),
        ..cfg
    };
    assert!(compare::run(&bad, CancellationToken::new()).await.is_err());
    stack.shutdown().await;
    shutdown.cancel();
    let _ = std::fs::remove_dir_all(&out);
}

/// `short` through the real stack (one simulated instance, its agent, the
/// router): conversations are replayed closed loop with the engine's own
/// answers, so every later turn hits the previous turn's prompt *and* answer
/// (the blocks decode filled, published as vLLM publishes them), and the
/// router's index, fed by the agent, knows those answer blocks too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_conversations_hit_the_answers_through_the_router() {
    use warmpath_bench::compare::driver::{drive, DriveConfig};
    let shutdown = CancellationToken::new();
    let (_, stack) = sim_stack(1, 4096, Strategy::KvAware, None, &shutdown).await;
    let trace = warmpath_bench::workload::generate(&WorkloadSpec {
        docs: 2,
        requests: 8,
        rate: 4.0,
        ..WorkloadSpec::new(WorkloadKind::Short)
    })
    .unwrap();
    assert!(trace.iter().all(|r| r.conversation().is_some()));
    let cfg = DriveConfig {
        urls: stack.router_urls.clone(),
        spread_seed: 0,
        fidelity_every: 1,
        timeout: Duration::from_secs(60),
        inspect_token: stack.admin_token.clone(),
    };
    let pb = indicatif::ProgressBar::hidden();
    let samples = tokio::time::timeout(
        Duration::from_secs(120),
        drive(&reqwest::Client::new(), &cfg, &trace, &pb, &shutdown),
    )
    .await
    .unwrap();
    assert!(samples.iter().all(|s| s.error.is_none()), "{samples:?}");
    let bs = 16;
    let (mut later_turns, mut index_knew_answer) = (0, 0);
    let mut last: std::collections::HashMap<&str, usize> = Default::default();
    for (i, (r, s)) in trace.iter().zip(&samples).enumerate() {
        assert_eq!(s.completion_tokens, u64::from(r.max_tokens));
        let conv = r.conversation().unwrap();
        if let Some(&p) = last.get(conv) {
            let prev = &samples[p];
            // One instance, ample cache: the whole previous prompt and answer
            // (less the answer's last token, never computed) is cached.
            let reusable = prev.prompt_tokens + prev.completion_tokens - 1;
            assert_eq!(s.cached_tokens, reusable / bs * bs, "turn {i}: {s:?}");
            later_turns += 1;
            let predicted = s.predicted_blocks.unwrap_or(0) * bs;
            index_knew_answer += usize::from(predicted > prev.prompt_tokens);
        }
        last.insert(conv, i);
    }
    assert!(later_turns >= 3, "{later_turns}");
    // The answer's last block may race the next turn through the event
    // pipeline; its earlier blocks were published long before.
    assert!(
        2 * index_knew_answer >= later_turns,
        "{index_knew_answer} of {later_turns}"
    );
    stack.shutdown().await;
    shutdown.cancel();
}
