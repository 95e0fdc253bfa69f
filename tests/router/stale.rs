//! Stale is not empty (issue 17 item 4): when a worker's agent dies but its
//! engine still passes health probes, the entries the agent last published
//! keep a discounted weight in kv_aware's match, so a warm prefix stays on
//! the engine that holds it instead of going to a cold one.
//!
//! The router binary runs as a process over two test backends; a raw gRPC
//! client plays the agent, and dropping its stream is the agent dying. If a
//! stale worker's entries counted for nothing, the request after the agent's
//! death would be placed as cold (`prefix_hash` or `cold`, not `kv_match`).

use crate::{raw_agent, support};

use raw_agent::{agent, Router};
use serde_json::{json, Value};
use std::time::Duration;
use support::poll::poll;
use support::*;
use warmpath_core::tokenize::tiny;
use warmpath_core::{hash_tokens, HashSeed};

const BS: usize = 4;
const TOKENS: u32 = 64;

fn prompt() -> Value {
    json!({"model": "m", "prompt": (0..TOKENS).collect::<Vec<u32>>(), "max_tokens": 1})
}

async fn worker_view(r: &Router, c: &TestClient, worker: &str) -> Value {
    let v = get_url(c, &format!("{}/cache-index", r.http)).await.json();
    v["pools"][0]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"] == worker)
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agents_last_entries_keep_a_warm_prefix_on_its_healthy_engine() {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let bs = backends(2).await;
    let yaml = format!(
        "grpc_listen: 127.0.0.1:0\ningest: {{stale_after_ms: 500}}\nhealth: {{probe_interval_ms: 100, eject_after: 1}}\npools:\n  - model: m\n    strategy: kv_aware\n    tokenizer: {}\n    block_size: {BS}\n    backends: [{{url: '{}', worker_id: b0}}, {{url: '{}', worker_id: b1}}]\n",
        dir.path().display(),
        bs[0].url(),
        bs[1].url()
    );
    let r = Router::start(dir.path(), &yaml).await;
    let c = client();
    let url = format!("{}/v1/completions", r.http);
    // Nobody holds it: it is placed cold. The other one will hold it.
    let first = post(&c, &url, &prompt(), &[]).await;
    let owner = first.backend().to_owned();
    let holder = if owner == "b0" { "b1" } else { "b0" };
    let toks: Vec<u32> = (0..TOKENS).collect();
    let chain: Vec<u64> = hash_tokens(HashSeed::new("m", "", ""), BS, &toks)
        .iter()
        .map(|h| h.0)
        .collect();
    let stream = agent(&r.grpc, holder, &chain, None).await;
    poll(
        "the holder's snapshot to land",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (r.blocks(&c, holder).await == chain.len() as u64).then_some(()),
    )
    .await;
    let warm = post(&c, &url, &prompt(), &[]).await;
    assert_eq!((warm.backend(), warm.decision()), (holder, "kv_match"));

    // The agent dies; its engine keeps answering its health probes.
    drop(stream);
    poll(
        "the holder's view to go stale",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (worker_view(&r, &c, holder).await["stale"] == true).then_some(()),
    )
    .await;
    assert_eq!(r.blocks(&c, holder).await, chain.len() as u64);
    let after = post(&c, &url, &prompt(), &[]).await;
    assert_eq!(
        (after.backend(), after.decision()),
        (holder, "kv_match"),
        "a stale but healthy holder keeps its warm prefix"
    );
    // Its engine fails its probes: then the stale entries stop mattering.
    bs.iter()
        .find(|b| b.name() == holder)
        .unwrap()
        .set_healthy(false);
    poll(
        "the holder to leave rotation",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (worker_view(&r, &c, holder).await["healthy"] == false).then_some(()),
    )
    .await;
    let gone = post(&c, &url, &prompt(), &[]).await;
    assert_eq!(gone.backend(), owner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_view_is_shown_and_follows_the_agents_load() {
    use warmpath_proto::v1::{agent_message::Msg, AgentMessage, Load};
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(1).await;
    let yaml = format!(
        "grpc_listen: 127.0.0.1:0\npools:\n  - model: m\n    block_size: {BS}\n    backends: [{{url: '{}', worker_id: b0}}]\n",
        bs[0].url()
    );
    let r = Router::start(dir.path(), &yaml).await;
    let c = client();
    let (tx, _answers) = agent(&r.grpc, "b0", &[], None).await;
    let load = |partial| AgentMessage {
        msg: Some(Msg::Load(Load {
            engine_up: true,
            kv_usage: 0.51,
            capacity_blocks: 8_192,
            partial,
            ..Default::default()
        })),
    };
    for partial in [true, false] {
        tx.send(load(partial)).await.unwrap();
        poll(
            "/cache-index to show the agent's partial flag",
            Duration::from_secs(10),
            Duration::from_millis(20),
            async || (worker_view(&r, &c, "b0").await["partial"] == partial).then_some(()),
        )
        .await;
    }
}
