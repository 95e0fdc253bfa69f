//! The partial rule end to end (issue 17 item 3): with kv_aware, a prefix no
//! backend holds goes to its ring owner (`prefix_hash`) when that owner's
//! agent reports a `partial` view: its missing blocks are unknown, not
//! absent, and the ring owner is where the prefix went before the agent's
//! view began.
//!
//! Two router binaries over the same two test backends: an oracle with
//! `strategy: prefix_aware` names each prompt's ring owner (kv_aware's
//! fallback is that same ring), and the router under test runs kv_aware
//! with its default cold placement, a raw gRPC agent per backend. The
//! control, with every view complete, shows that default placement deals
//! cold prefixes out between the backends (the second of two prefixes owned
//! by b0 lands on b1, the emptier one), so prompts owned by b0 do not all
//! go there. Then b0's agent reports `partial: true`, and every further
//! prompt b0 owns must go to b0 as `prefix_hash`: without the rule they
//! continue the same deal and some land on b1, so the test fails there.

use crate::{raw_agent, support};

use raw_agent::{agent, Router};
use serde_json::{json, Value};
use std::time::Duration;
use support::poll::poll;
use support::*;
use tokio::sync::mpsc;
use warmpath_core::tokenize::tiny;
use warmpath_proto::v1::{agent_message::Msg, AgentMessage, Load};

const BS: usize = 4;
/// Candidate prompts; about half are owned by b0.
const CANDIDATES: u32 = 40;
/// Prompts owned by b0 sent in each phase.
const PER_PHASE: usize = 6;

/// A 64-token id prompt of its own: distinct ids, so distinct prefix keys
/// and block chains.
fn prompt(k: u32) -> Value {
    let ids: Vec<u32> = (0..64).map(|i| (k * 64 + i) % 1000).collect();
    json!({"model": "m", "prompt": ids, "max_tokens": 1})
}

fn yaml(model_dir: &std::path::Path, strategy: &str, bs: &[TestBackend]) -> String {
    format!(
        "grpc_listen: 127.0.0.1:0\npools:\n  - model: m\n    strategy: {strategy}\n    tokenizer: {}\n    block_size: {BS}\n    backends: [{{url: '{}', worker_id: b0}}, {{url: '{}', worker_id: b1}}]\n",
        model_dir.display(),
        bs[0].url(),
        bs[1].url()
    )
}

/// Sends `Load` with `partial` and waits until `/cache-index` shows it.
async fn report(r: &Router, c: &TestClient, tx: &mpsc::Sender<AgentMessage>, partial: bool) {
    tx.send(AgentMessage {
        msg: Some(Msg::Load(Load {
            engine_up: true,
            kv_usage: if partial { 0.5 } else { 0.0 },
            partial,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    poll(
        "/cache-index to show b0's partial flag",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let v = get_url(c, &format!("{}/cache-index", r.http)).await.json();
            let b0 = v["pools"][0]["workers"]
                .as_array()?
                .iter()
                .find(|w| w["worker_id"] == "b0")?
                .clone();
            (b0["partial"] == partial).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_prefix_goes_to_its_ring_owner_when_that_owners_view_is_partial() {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let bs = backends(2).await;
    let c = client();

    // The oracle: each candidate's ring owner.
    let oracle_dir = tempfile::tempdir().unwrap();
    let oracle = Router::start(oracle_dir.path(), &yaml(dir.path(), "prefix_aware", &bs)).await;
    let mut owned = Vec::new();
    for k in 0..CANDIDATES {
        let reply = post(
            &c,
            &format!("{}/v1/completions", oracle.http),
            &prompt(k),
            &[],
        )
        .await;
        assert_eq!(reply.decision(), "prefix_hash", "candidate {k}");
        if reply.backend() == "b0" {
            owned.push(k);
        }
    }
    drop(oracle);
    assert!(
        owned.len() >= 2 * PER_PHASE,
        "only {} of {CANDIDATES} candidates are owned by b0",
        owned.len()
    );

    let r = Router::start(dir.path(), &yaml(dir.path(), "kv_aware", &bs)).await;
    let url = format!("{}/v1/completions", r.http);
    // Agents with empty views: every candidate is cold everywhere.
    let (tx0, _answers0) = agent(&r.grpc, "b0", &[], None).await;
    let (tx1, _answers1) = agent(&r.grpc, "b1", &[], None).await;
    tx1.send(AgentMessage {
        msg: Some(Msg::Load(Load {
            engine_up: true,
            ..Default::default()
        })),
    })
    .await
    .unwrap();

    // Control: complete views. Cold placement deals the prefixes out.
    report(&r, &c, &tx0, false).await;
    let mut control = Vec::new();
    for k in &owned[..PER_PHASE] {
        let reply = post(&c, &url, &prompt(*k), &[]).await;
        assert_eq!(reply.status, 200);
        control.push((*k, reply.backend().to_owned(), reply.decision().to_owned()));
    }
    assert!(
        control.iter().any(|(_, b, _)| b == "b1"),
        "with complete views some of b0's cold prefixes should land on b1: {control:?}"
    );

    // b0's view is partial: every cold prefix it owns goes there.
    report(&r, &c, &tx0, true).await;
    for k in &owned[PER_PHASE..2 * PER_PHASE] {
        let reply = post(&c, &url, &prompt(*k), &[]).await;
        assert_eq!(
            (reply.backend(), reply.decision()),
            ("b0", "prefix_hash"),
            "candidate {k}, owned by b0 (partial); control was {control:?}"
        );
    }
}
