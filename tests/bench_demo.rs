//! End to end: a quick comparison through simulated instances, real agents
//! and the real router on 127.0.0.1 (what `warmpath-bench demo --quick` runs).
#![allow(clippy::unwrap_used)]

use std::time::Duration;
use tokio_util::sync::CancellationToken;
use warmpath_bench::compare::{self, CompareConfig};
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
        trace: None,
        strategies: vec![Strategy::Random, Strategy::KvAware],
        duration_s: 4.0,
        rate: 6.0,
        search_rates: vec![12.0],
        search_step_s: 1.0,
        slo_ms: 10_000.0,
        fidelity_every: 1,
        concurrency_threshold: 64,
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
