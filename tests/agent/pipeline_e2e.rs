//! End-to-end KV event pipeline: a vLLM-compatible publisher (the in-repo
//! emulator, real ZMQ on 127.0.0.1) -> the real `warmpath-agent` binary ->
//! the router's real gRPC ingest -> `POST /cache-index/query`.
//!
//! The router runs in-process through `warmpath_router::start` (the same
//! code as its binary) so the test can restart it on the same port; the
//! agents are the real binaries. Faults covered: router restart (index
//! complete again from snapshots), engine restart (sequence back to 0),
//! a dropped batch (replay) and garbage frames.

use crate::poll;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use warmpath_router::config::{BackendConfig, PoolConfig, RouterConfig};
use warmpath_vllm_events::{
    BlockStored, EngineBlockHash, KvEvent, KvEventPublisher, PublisherConfig,
};

const BS: u32 = 4;

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stored(first_hash: u64, parent: Option<u64>, tokens: std::ops::Range<u32>) -> KvEvent {
    let toks: Vec<u32> = tokens.collect();
    let n = toks.len() as u64 / u64::from(BS);
    KvEvent::BlockStored(BlockStored {
        block_hashes: (0..n)
            .map(|i| EngineBlockHash::Int(first_hash + i))
            .collect(),
        parent_block_hash: parent.map(EngineBlockHash::Int),
        token_ids: toks,
        block_size: BS,
        lora_id: None,
        medium: None,
        lora_name: None,
        extra_keys: None,
        group_idx: None,
        kv_cache_spec_kind: None,
        kv_cache_spec_sliding_window: None,
    })
}

async fn publisher() -> KvEventPublisher {
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:0");
    cfg.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    KvEventPublisher::bind(cfg).await.unwrap()
}

/// The routers' agent secret: each agent presents its worker's credential.
const SECRET: &str = "fleet-secret";

fn agent(worker: &str, p: &KvEventPublisher, grpc: std::net::SocketAddr) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["--worker-id", worker, "--model", "m"])
        .args(["--engine-url", "http://127.0.0.1:9"])
        .args(["--kv-events", p.endpoint()])
        .args(["--kv-replay", p.replay_endpoint().unwrap()])
        .args(["--router", &format!("http://{grpc}")])
        .args([
            "--agent-token",
            &warmpath_proto::worker_token(SECRET, worker),
        ])
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Proc(child)
}

async fn router(tokenizer: &std::path::Path, grpc: &str) -> warmpath_router::RunningRouter {
    let mut pool = PoolConfig::new("m");
    pool.block_size = BS as usize;
    pool.tokenizer = Some(tokenizer.to_path_buf());
    pool.strategy = Some(warmpath_core::Strategy::KvAware);
    pool.backends = vec![
        BackendConfig {
            url: "http://127.0.0.1:9".into(),
            worker_id: Some("w1".into()),
            api_key: None,
        },
        BackendConfig {
            url: "http://127.0.0.1:10".into(),
            worker_id: Some("w2".into()),
            api_key: None,
        },
    ];
    let config = RouterConfig {
        listen: "127.0.0.1:0".into(),
        grpc_listen: Some(grpc.into()),
        agent_secret: Some(SECRET.into()),
        pools: vec![pool],
        ..Default::default()
    };
    warmpath_router::start(config, CancellationToken::new())
        .await
        .unwrap()
}

/// Matched blocks per worker for a token-id prompt 0..n.
async fn matches(http: std::net::SocketAddr, n: u32) -> (u64, u64) {
    let body = serde_json::json!({"model": "m", "prompt": (0..n).collect::<Vec<u32>>()});
    let v: serde_json::Value = reqwest::Client::new()
        .post(format!("http://{http}/cache-index/query"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let get = |w: &str| {
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["worker_id"] == w)
            .map_or(0, |x| x["matched_blocks"].as_u64().unwrap())
    };
    (get("w1"), get("w2"))
}

/// Whether `/cache-index` shows w1's and w2's holdings prefix-closed.
async fn prefix_closed(http: std::net::SocketAddr) -> (bool, bool) {
    let v: serde_json::Value = reqwest::get(format!("http://{http}/cache-index"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let workers = v["pools"][0]["workers"].as_array().unwrap();
    let of = |w: &str| {
        workers
            .iter()
            .find(|x| x["worker_id"] == w)
            .is_some_and(|x| x["prefix_closed"] == true)
    };
    (of("w1"), of("w2"))
}

async fn wait_for(
    http: std::net::SocketAddr,
    n: u32,
    want: (u64, u64),
    limit: Duration,
) -> Duration {
    let start = Instant::now();
    let what = format!("the index to reach {want:?}");
    poll::poll(&what, limit, Duration::from_millis(50), async || {
        (matches(http, n).await == want).then_some(())
    })
    .await;
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_router_index_and_survive_faults() {
    let dir = tempfile::tempdir().unwrap();
    warmpath_core::tokenize::tiny::write_model_dir(dir.path()).unwrap();
    let r = router(dir.path(), "127.0.0.1:0").await;
    let http = r.http_addr;
    let grpc = r.grpc_addr.unwrap();

    let p1 = publisher().await;
    let p2 = publisher().await;
    let _a1 = agent("w1", &p1, grpc);
    let _a2 = agent("w2", &p2, grpc);
    // ZMQ subscribers join asynchronously; events published before that are
    // recovered through the replay socket, which is part of what is tested.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // w1 caches tokens 0..32 (8 blocks) in two events; w2 tokens 0..16.
    p1.publish(vec![stored(100, None, 0..16)]).await.unwrap();
    p1.publish(vec![stored(104, Some(103), 16..32)])
        .await
        .unwrap();
    p2.publish(vec![stored(500, None, 0..16)]).await.unwrap();
    wait_for(http, 40, (8, 4), Duration::from_secs(20)).await;
    // Both caches are prefix-closed, and their agents said so.
    assert_eq!(prefix_closed(http).await, (true, true));

    // A dropped batch (published into the replay buffer only) is recovered by
    // replay when the next batch reveals the gap.
    p2.publish_unsent(vec![stored(504, Some(503), 16..24)])
        .await;
    p2.publish(vec![stored(506, Some(505), 24..28)])
        .await
        .unwrap();
    wait_for(http, 40, (8, 7), Duration::from_secs(20)).await;
    // An offloaded copy (a block on the CPU tier) is not closed.
    let mut off = stored(104, Some(103), 16..20);
    if let KvEvent::BlockStored(s) = &mut off {
        s.medium = Some(warmpath_vllm_events::Medium::Cpu);
        s.token_ids.clear();
    }
    p1.publish(vec![off]).await.unwrap();
    let what = "w1's agent to report its offloaded block";
    poll::poll(
        what,
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || (prefix_closed(http).await == (false, true)).then_some(()),
    )
    .await;

    // Garbage on the event socket is skipped; later events still land.
    p1.send_raw(vec![bytes::Bytes::from_static(b"junk")])
        .await
        .unwrap();
    p1.publish_payload(bytes::Bytes::from_static(b"\xc1\xc1\xc1"))
        .await
        .unwrap();
    p1.publish(vec![stored(108, Some(107), 32..36)])
        .await
        .unwrap();
    wait_for(http, 40, (9, 7), Duration::from_secs(20)).await;

    // Router restart on the same gRPC port: the agents reconnect and resend
    // snapshots; the new router's index is complete again.
    r.shutdown();
    r.wait().await;
    let r = router(dir.path(), &grpc.to_string()).await;
    let http = r.http_addr;
    let took = wait_for(http, 40, (9, 7), Duration::from_secs(30)).await;
    eprintln!("index complete again {took:?} after the router restart");

    // Engine restart: sequence numbers go back to 0; the agent clears the
    // worker; what the new engine stores is all there is.
    p1.restart().await;
    p1.publish(vec![stored(900, None, 0..8)]).await.unwrap();
    wait_for(http, 40, (2, 7), Duration::from_secs(20)).await;
    r.shutdown();
    r.wait().await;
}
