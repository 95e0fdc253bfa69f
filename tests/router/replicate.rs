//! Replication on the router binary with agents (issue 21): a prefix that
//! brings more than one backend's even share of the traffic gets a
//! deliberate second warm copy (decision `replicate`, counted in
//! `/metrics`), both holders then serve it, and once other prefixes bring
//! most of the traffic the copy is dropped: no new copy, and its requests
//! stay on one backend although both hold it. The router binary runs as a
//! process over two test backends; raw gRPC clients play the agents,
//! publishing what the engines cache (w0 the hot prefix from the start, w1
//! once the copy was started). With agents the router shares decisions by
//! default, so its ties are drawn from an rng seeded by the prefix key: the
//! copy's share of the traffic is what `router_kv`'s in-process twin of this
//! test (no agents, a random rng) cannot see.

use crate::{raw_agent, support};

use raw_agent::{agent, Router};
use serde_json::{json, Value};
use std::time::Duration;
use support::poll::poll;
use support::*;
use warmpath_core::tokenize::tiny;
use warmpath_core::BlockHash;
use warmpath_proto::v1::{agent_message::Msg, delta, AgentMessage, Delta, Stored};

/// A completion on the token-id prompt of prefix `k` (0 is the hot one):
/// 64 ids, 16 blocks of 4. Token ids keep the prefix key the whole prompt
/// (a chat's key is its first 4096 characters, question included
/// when the system prompt is shorter).
fn request(k: usize) -> Value {
    let first = 1000 * k as u32;
    json!({"model": "m", "prompt": (first..first + 64).collect::<Vec<u32>>(), "max_tokens": 1})
}

/// The chain the router hashes for `body`.
async fn chain(r: &Router, c: &TestClient, body: &Value) -> Vec<u64> {
    let q = post(c, &format!("{}/cache-index/query", r.http), body, &[]).await;
    q.json()["block_hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| BlockHash::from_hex(h.as_str().unwrap()).unwrap().0)
        .collect()
}

/// `warmpath_requests_total{decision="replicate"}`, summed.
async fn replicated(r: &Router, c: &TestClient) -> f64 {
    let m = get_url(c, &format!("{}/metrics", r.http)).await;
    String::from_utf8_lossy(&m.body)
        .lines()
        .filter(|l| {
            l.starts_with("warmpath_requests_total") && l.contains("decision=\"replicate\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_too_hot_for_one_backend_is_copied_until_its_load_falls() {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let bs = backends(2).await;
    let yaml = format!(
        "grpc_listen: 127.0.0.1:0\ningest: {{stale_after_ms: 60000}}\npools:\n  - model: m\n    strategy: kv_aware\n    tokenizer: {}\n    block_size: 4\n    backends: [{{url: '{}', worker_id: w0}}, {{url: '{}', worker_id: w1}}]\n",
        dir.path().display(),
        bs[0].url(),
        bs[1].url()
    );
    let r = Router::start(dir.path(), &yaml).await;
    let c = client();
    let url = format!("{}/v1/completions", r.http);
    let hot = chain(&r, &c, &request(0)).await;
    let _w0 = agent(&r.grpc, "w0", &hot, None).await;
    let (w1, _w1_answers) = agent(&r.grpc, "w1", &[], None).await;
    poll(
        "w0's snapshot to land",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (r.blocks(&c, "w0").await == hot.len() as u64).then_some(()),
    )
    .await;
    // All the traffic is one prefix: more than one backend's even share.
    // Once its popularity is known, one request starts a copy on w1.
    let mut copy = None;
    for _ in 0..100 {
        let reply = post(&c, &url, &request(0), &[]).await;
        assert_eq!(reply.status, 200);
        if reply.decision() == "replicate" {
            copy = Some(reply.backend().to_owned());
            break;
        }
        assert_eq!((reply.backend(), reply.decision()), ("w0", "kv_match"));
    }
    assert_eq!(copy.as_deref(), Some("w1"), "no copy was started");
    assert_eq!(replicated(&r, &c).await, 1.0);
    // w1's engine cached it: its agent publishes the blocks.
    w1.send(AgentMessage {
        msg: Some(Msg::Delta(Delta {
            seq: 2,
            op: Some(delta::Op::Stored(Stored {
                parent: None,
                hashes: hot.clone(),
                tier: 1,
            })),
            observed_unix_micros: 0,
            prefix_closed: false,
        })),
    })
    .await
    .unwrap();
    poll(
        "w1's copy to land",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (r.blocks(&c, "w1").await == hot.len() as u64).then_some(()),
    )
    .await;
    // Both hold it, both idle: the tie splits its traffic (before the fix
    // the key-seeded draw sent all 30 to one holder).
    let mut served = [0u32; 2];
    for _ in 0..30 {
        let reply = post(&c, &url, &request(0), &[]).await;
        assert_eq!(reply.decision(), "kv_match");
        served[usize::from(reply.backend() == "w1")] += 1;
    }
    assert!(
        served[0] > 0 && served[1] > 0,
        "both copies serve: {served:?}"
    );
    // Other prefixes now bring most of the traffic: one backend serves the
    // hot one within an even share again. The copy is dropped, no other is
    // started, and its requests stay on one backend although both hold it.
    for k in 0..200 {
        let reply = post(&c, &url, &request(k % 5 + 1), &[]).await;
        assert_eq!(reply.status, 200);
    }
    let mut last = Vec::new();
    for _ in 0..20 {
        let reply = post(&c, &url, &request(0), &[]).await;
        assert_ne!(reply.decision(), "replicate");
        last.push(reply.backend().to_owned());
    }
    let tail = &last[10..];
    assert!(tail.iter().all(|b| *b == tail[0]), "{last:?}");
    assert_eq!(replicated(&r, &c).await, 1.0, "no second copy");
}
