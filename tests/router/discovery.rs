//! End-to-end test of DNS discovery on the real `warmpath-router` binary: a
//! DNS server started here (hickory-server on 127.0.0.1) changes its answer
//! from 2 backends to 3 to 1, and the pool follows within one interval; a
//! failing nameserver keeps the last known set. A member missing from one
//! answer waits out a grace of 3 intervals out of rotation, keeping its
//! index and its agent; one gone longer is drained and removed.

use crate::{dns, raw_agent, support};

use std::time::{Duration, Instant};
use support::*;

const INTERVAL_MS: u64 = 200;
/// `health.probe_interval_ms` that makes the resolve interval
/// [`INTERVAL_MS`] (2.5 probe intervals).
const PROBE_MS: u64 = INTERVAL_MS * 2 / 5;

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
        "health: {{probe_interval_ms: {PROBE_MS}}}\npools:\n  - model: m\n    strategy: least_outstanding\n    discovery:\n      - dns:\n          name: engines.test.\n          nameserver: {}\n",
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

/// The grace a vanished member gets: 3 of the provider's intervals.
const FLAP_INTERVAL_MS: u64 = 400;
/// `health.probe_interval_ms` that makes the resolve interval
/// [`FLAP_INTERVAL_MS`].
const FLAP_PROBE_MS: u64 = FLAP_INTERVAL_MS * 2 / 5;
const GRACE: Duration = Duration::from_millis(3 * FLAP_INTERVAL_MS);

/// Backends `b0` and `b1` behind `engines.test.` (SRV), a router with the
/// gRPC ingest resolving it every [`FLAP_INTERVAL_MS`], and `b1`'s agent
/// publishing 8 blocks (its stream is returned: keep it alive).
async fn flapping_pool(
    dir: &std::path::Path,
) -> (
    Vec<TestBackend>,
    dns::TestDns,
    raw_agent::Router,
    (
        tokio::sync::mpsc::Sender<warmpath_proto::v1::AgentMessage>,
        tonic::Streaming<warmpath_proto::v1::RouterMessage>,
    ),
) {
    let bs = backends(2).await;
    let dns = dns::TestDns::start().await;
    for i in 0..2 {
        dns.set_a(&format!("b{i}.test."), &["127.0.0.1".parse().unwrap()])
            .await;
    }
    let both = [
        ("b0.test.", bs[0].addr.port()),
        ("b1.test.", bs[1].addr.port()),
    ];
    dns.set_srv("engines.test.", &both).await;
    let r = raw_agent::Router::start(dir, &format!(
        "grpc_listen: 127.0.0.1:0\nhealth: {{probe_interval_ms: {FLAP_PROBE_MS}}}\npools:\n  - model: m\n    block_size: 4\n    strategy: least_outstanding\n    discovery:\n      - dns:\n          name: engines.test.\n          nameserver: {}\n",
        dns.addr
    )).await;
    let agent = raw_agent::agent(&r.grpc, &bs[1].url(), &(1..=8).collect::<Vec<_>>(), None).await;
    let c = client();
    poll::poll(
        "b1's agent's snapshot in the index",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || (member(&c, &r, &bs[1]).await?["index_blocks"] == 8).then_some(()),
    )
    .await;
    (bs, dns, r, agent)
}

/// `b`'s entry in the admin listing, if it is a member.
async fn member(
    c: &TestClient,
    r: &raw_agent::Router,
    b: &TestBackend,
) -> Option<serde_json::Value> {
    let v = get_url(c, &format!("{}/admin/pools/m/backends", r.http))
        .await
        .json();
    v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["worker_id"] == b.url())
        .cloned()
}

async fn removals(c: &TestClient, r: &raw_agent::Router) -> f64 {
    r.metric(
        c,
        r#"warmpath_pool_membership_changes_total{pool="m",op="remove"} "#,
    )
    .await
}

async fn completes(c: &TestClient, r: &raw_agent::Router) {
    let reply = post(
        c,
        &format!("{}/v1/completions", r.http),
        &serde_json::json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    assert_eq!(reply.status, 200, "another client's request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_missing_from_one_answer_keeps_its_index_and_its_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (bs, dns, r, (agent, _answers)) = flapping_pool(dir.path()).await;
    let c = client();
    // One answer without b1 (a DNS server answering a subset, a pod that
    // failed one readiness probe).
    dns.set_srv("engines.test.", &[("b0.test.", bs[0].addr.port())])
        .await;
    let aside = poll::poll(
        "b1 out of rotation",
        Duration::from_secs(10),
        Duration::from_millis(5),
        async || {
            let m = member(&c, &r, &bs[1]).await;
            m.as_ref()
                .is_none_or(|m| m["draining"] == true)
                .then_some(m)
        },
    )
    .await;
    let before = bs[1].count();
    completes(&c, &r).await;
    completes(&c, &r).await;
    assert_eq!(
        bs[1].count(),
        before,
        "no new request goes to a member out of rotation"
    );
    dns.set_srv(
        "engines.test.",
        &[
            ("b0.test.", bs[0].addr.port()),
            ("b1.test.", bs[1].addr.port()),
        ],
    )
    .await;
    let back = poll::poll(
        "b1 back in rotation",
        Duration::from_secs(10),
        Duration::from_millis(5),
        async || {
            member(&c, &r, &bs[1])
                .await
                .filter(|m| m["draining"] == false)
        },
    )
    .await;
    let aside = aside.expect("b1 stays a member while it is gone");
    assert!(aside["missing_for_ms"].is_u64(), "{aside}");
    assert_eq!(back["index_blocks"], 8, "its index entries stay: {back}");
    assert!(back["missing_for_ms"].is_null(), "{back}");
    assert_eq!(removals(&c, &r).await, 0.0, "never removed");
    // Its agent was never refused: what it publishes still lands.
    agent
        .send(warmpath_proto::v1::AgentMessage {
            msg: Some(warmpath_proto::v1::agent_message::Msg::Delta(
                warmpath_proto::v1::Delta {
                    seq: 2,
                    op: Some(warmpath_proto::v1::delta::Op::Stored(
                        warmpath_proto::v1::Stored {
                            parent: None,
                            hashes: vec![100],
                            tier: 1,
                        },
                    )),
                    ..Default::default()
                },
            )),
        })
        .await
        .unwrap();
    poll::poll(
        "the agent's next block in the index",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || (member(&c, &r, &bs[1]).await?["index_blocks"] == 9).then_some(()),
    )
    .await;
    completes(&c, &r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_gone_past_its_grace_is_drained_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (bs, dns, r, _agent) = flapping_pool(dir.path()).await;
    let c = client();
    let gone_at = Instant::now();
    dns.set_srv("engines.test.", &[("b0.test.", bs[0].addr.port())])
        .await;
    poll::poll(
        "b1 removed",
        Duration::from_secs(20),
        Duration::from_millis(10),
        async || member(&c, &r, &bs[1]).await.is_none().then_some(()),
    )
    .await;
    let took = gone_at.elapsed();
    assert!(
        took >= GRACE,
        "removed {took:?} after it left the answer: before its grace"
    );
    println!("NUMBER dns member gone past its grace removed after {took:?} (grace {GRACE:?})");
    assert_eq!(removals(&c, &r).await, 1.0);
    let workers = get_url(&c, &format!("{}/cache-index", r.http)).await.json();
    assert!(
        !workers["pools"][0]["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["worker_id"] == bs[1].url()),
        "its index entries went with it: {workers}"
    );
    completes(&c, &r).await;
    // Back later: a new member, which joins as any other.
    dns.set_srv(
        "engines.test.",
        &[
            ("b0.test.", bs[0].addr.port()),
            ("b1.test.", bs[1].addr.port()),
        ],
    )
    .await;
    poll::poll(
        "b1 added again",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || {
            member(&c, &r, &bs[1])
                .await
                .filter(|m| m["draining"] == false)
        },
    )
    .await;
    completes(&c, &r).await;
}
