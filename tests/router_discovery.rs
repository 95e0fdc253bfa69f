//! End-to-end test of DNS discovery on the real `warmpath-router` binary: a
//! DNS server started here (hickory-server on 127.0.0.1) changes its answer
//! from 2 backends to 3 to 1, and the pool follows within one interval; a
//! failing nameserver keeps the last known set.
#![allow(clippy::unwrap_used)]

mod support;

#[path = "support/dns.rs"]
mod dns;

use std::time::{Duration, Instant};
use support::*;

const INTERVAL_MS: u64 = 200;

async fn members(c: &TestClient, r: &RouterProcess) -> Vec<String> {
    let v = get_url(c, &r.url("/admin/pools/m/backends")).await.json();
    let mut ids: Vec<String> = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["draining"] == false)
        .map(|m| m["worker_id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

async fn follows(c: &TestClient, r: &RouterProcess, want: &[&TestBackend]) -> Duration {
    let mut want: Vec<String> = want.iter().map(|b| b.url()).collect();
    want.sort();
    let t = Instant::now();
    poll::poll(
        "the pool to follow the DNS answer",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || (members(c, r).await == want).then_some(()),
    )
    .await;
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_follows_a_dns_answer_from_two_to_three_to_one_backend() {
    let bs = backends(3).await;
    let dns = dns::TestDns::start().await;
    let targets: Vec<(String, u16)> = (0..3)
        .map(|i| (format!("b{i}.test."), bs[i].addr.port()))
        .collect();
    for (t, _) in &targets {
        dns.set_a(t, &["127.0.0.1".parse().unwrap()]).await;
    }
    let srv = |n: usize| -> Vec<(&str, u16)> {
        targets[..n].iter().map(|(t, p)| (t.as_str(), *p)).collect()
    };
    dns.set_srv("engines.test.", &srv(2)).await;
    let r = RouterProcess::from_yaml(&format!(
        "pools:\n  - model: m\n    strategy: least_outstanding\n    discovery:\n      - dns:\n          name: engines.test.\n          srv: true\n          interval_ms: {INTERVAL_MS}\n          timeout_ms: 200\n          nameserver: {}\n",
        dns.addr
    )).await;
    let c = client();
    // Resolved before the router listens: it routes at once.
    assert_eq!(members(&c, &r).await.len(), 2);
    let reply = post(
        &c,
        &r.url("/v1/completions"),
        &serde_json::json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    assert_eq!(reply.status, 200);

    dns.set_srv("engines.test.", &srv(3)).await;
    let took = follows(&c, &r, &[&bs[0], &bs[1], &bs[2]]).await;
    assert!(
        took < Duration::from_millis(2 * INTERVAL_MS + 500),
        "2 -> 3 took {took:?}"
    );
    println!("NUMBER dns 2->3 followed in {took:?} (interval {INTERVAL_MS} ms)");
    dns.set_srv("engines.test.", &srv(1)).await;
    let took = follows(&c, &r, &[&bs[0]]).await;
    assert!(
        took < Duration::from_millis(2 * INTERVAL_MS + 500),
        "3 -> 1 took {took:?}"
    );
    println!("NUMBER dns 3->1 followed in {took:?} (interval {INTERVAL_MS} ms)");

    // An empty answer is a failure: the last set stays, the error shows.
    // (A round may have failed before, e.g. timed out on a loaded machine:
    // this one must add to the count.)
    let errors_before = discovery_status(&c, &r).await["errors"]
        .as_u64()
        .unwrap_or(0);
    dns.set_srv("engines.test.", &[]).await;
    let status = poll::poll(
        "the provider to report the failure",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let d = discovery_status(&c, &r).await;
            (d["errors"].as_u64().unwrap_or(0) > errors_before).then_some(d)
        },
    )
    .await;
    assert_eq!(status["provider"], "dns:engines.test.");
    assert!(status["last_error"].is_string(), "{status}");
    assert!(status["changes"].as_u64().unwrap() >= 3, "{status}");
    assert_eq!(status["last_result"], serde_json::json!([bs[0].url()]));
    assert_eq!(members(&c, &r).await, [bs[0].url()], "never emptied");
    // Each failed round is counted in /metrics just after its status is
    // written (discovery/provider.rs `failed`): wait for this one's count.
    let errors = status["errors"].as_u64().unwrap() as f64;
    let error_rounds =
        r#"warmpath_discovery_rounds_total{pool="m",provider="dns:engines.test.",result="error"} "#;
    let text = poll::poll(
        "the failed round in /metrics",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let m = get_url(&c, &r.url("/metrics")).await;
            let text = String::from_utf8_lossy(&m.body).into_owned();
            (metric_value(&text, error_rounds) >= Some(errors)).then_some(text)
        },
    )
    .await;
    assert!(
        text.contains(r#"warmpath_discovery_backends{pool="m",provider="dns:engines.test."} 1"#),
        "{text}"
    );
}
