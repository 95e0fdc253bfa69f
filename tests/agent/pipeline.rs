//! Publisher -> agent -> test router, over real ZMQ and gRPC on 127.0.0.1.

use crate::common;

use bytes::Bytes;
use common::{wait_for, TestRouter};
use std::net::SocketAddr;
use std::time::Duration;
use warmpath_agent::{Agent, AgentConfig};
use warmpath_core::{hash_tokens, BlockHash, HashSeed};
use warmpath_proto::v1::Tier;
use warmpath_vllm_events::{
    BlockRemoved, BlockStored, EngineBlockHash, KvEvent, KvEventPublisher, Medium, PayloadForm,
    PublisherConfig,
};

const GPU: i32 = Tier::Gpu as i32;

async fn publisher(form: PayloadForm, replay: bool, topic_in_replay: bool) -> KvEventPublisher {
    let mut c = PublisherConfig::new("tcp://127.0.0.1:0");
    c.form = form;
    c.with_topic_in_replay = topic_in_replay;
    c.topic = "kv".into();
    if replay {
        c.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    }
    KvEventPublisher::bind(c).await.unwrap()
}

fn agent_config(p: &KvEventPublisher, routers: Vec<String>) -> AgentConfig {
    let mut c = AgentConfig::new("w1", "m", "http://127.0.0.1:9", p.endpoint());
    c.kv_replay = p.replay_endpoint().map(str::to_owned);
    c.routers = routers;
    c.topic = "kv".into();
    c.load_interval = Duration::ZERO;
    c.link.backoff_min = Duration::from_millis(20);
    c.link.backoff_max = Duration::from_millis(200);
    c
}

/// `n` blocks of 16 tokens (token values offset by `salt`) as one chain.
fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..(n * 16) as u32).map(|t| t + salt).collect()
}

fn stored(hashes: &[u64], parent: Option<u64>, toks: &[u32]) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: hashes.iter().map(|h| EngineBlockHash::Int(*h)).collect(),
        parent_block_hash: parent.map(EngineBlockHash::Int),
        token_ids: toks.to_vec(),
        block_size: 16,
        medium: Some(Medium::Gpu),
        ..Default::default()
    })
}

fn wp(toks: &[u32]) -> Vec<u64> {
    hash_tokens(HashSeed::new("m", "", ""), 16, toks)
        .into_iter()
        .map(|h: BlockHash| h.0)
        .collect()
}

async fn poke(p: &KvEventPublisher) {
    p.publish(vec![]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_router_as_warmpath_hashes() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let p = publisher(PayloadForm::Map, true, true).await;
    let agent = Agent::start(agent_config(&p, vec![router.url()]), None)
        .await
        .unwrap();
    let toks = tokens(3, 0);
    let want = wp(&toks);
    p.publish(vec![stored(&[1, 2], None, &toks[..32])])
        .await
        .unwrap();
    p.publish(vec![stored(&[3], Some(2), &toks[32..])])
        .await
        .unwrap();
    wait_for(
        "three blocks at the router",
        || {
            want.iter()
                .all(|h| router.view().blocks.contains(&(*h, GPU)))
        },
        || poke(&p),
    )
    .await;
    // Evict the last block.
    p.publish(vec![KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![EngineBlockHash::Int(3)],
        medium: Some(Medium::Gpu),
        group_idx: None,
    })])
    .await
    .unwrap();
    wait_for(
        "block 3 removed",
        || !router.view().blocks.contains(&(want[2], GPU)),
        || poke(&p),
    )
    .await;
    let v = router.view();
    assert_eq!(v.blocks.len(), 2);
    assert_eq!(v.seq_errors, 0);
    assert!(v
        .hellos
        .iter()
        .any(|h| h.block_size == 16 && h.worker_id == "w1" && h.model == "m"));
    assert_eq!(agent.stats().unknown_parents.get(), 0);
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_asking_for_snapshots_in_a_loop_gets_one_a_second() {
    // After the stream's first snapshot the router asks for 100 more at
    // once: one goes out at once, the other 99 wait and go out as one a
    // second later.
    let router = TestRouter::start_with("127.0.0.1:0".parse().unwrap(), None, 100).await;
    let p = publisher(PayloadForm::Map, false, false).await;
    let agent = Agent::start(agent_config(&p, vec![router.url()]), None)
        .await
        .unwrap();
    let start = std::time::Instant::now();
    wait_for(
        "three snapshots",
        || router.view().snapshots >= 3,
        || async {},
    )
    .await;
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "the third came after {:?}",
        start.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(router.view().snapshots, 3, "{:?}", router.view());
    assert_eq!(router.view().streams, 1);
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_batch_is_replayed_in_both_reply_layouts() {
    for (form, topic_in_replay) in [(PayloadForm::Map, true), (PayloadForm::Array, false)] {
        let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
        let p = publisher(form, true, topic_in_replay).await;
        let agent = Agent::start(agent_config(&p, vec![router.url()]), None)
            .await
            .unwrap();
        let toks = tokens(3, 100);
        let want = wp(&toks);
        p.publish(vec![stored(&[1], None, &toks[..16])])
            .await
            .unwrap();
        wait_for(
            "block 0",
            || router.view().blocks.contains(&(want[0], GPU)),
            || poke(&p),
        )
        .await;
        // Block 1 is lost on the live socket; block 2 chains on it.
        p.publish_unsent(vec![stored(&[2], Some(1), &toks[16..32])])
            .await;
        p.publish(vec![stored(&[3], Some(2), &toks[32..])])
            .await
            .unwrap();
        wait_for(
            "blocks 1 and 2 via replay",
            || {
                want.iter()
                    .all(|h| router.view().blocks.contains(&(*h, GPU)))
            },
            || poke(&p),
        )
        .await;
        let s = agent.stats();
        assert!(s.gaps.get() >= 1);
        assert!(s.replays_ok.get() >= 1);
        assert_eq!(s.gaps_unrecovered.get(), 0, "{form:?}");
        agent.shutdown().await;
        router.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreplayable_gap_forces_a_snapshot_and_unknown_parents_are_counted() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let p = publisher(PayloadForm::Map, false, true).await;
    let agent = Agent::start(agent_config(&p, vec![router.url()]), None)
        .await
        .unwrap();
    // No replay here: make sure the subscriber is live before the first block.
    wait_for(
        "agent hears the engine",
        || agent.stats().batches.get() > 0,
        || poke(&p),
    )
    .await;
    let toks = tokens(2, 7);
    let want = wp(&toks);
    p.publish(vec![stored(&[1], None, &toks[..16])])
        .await
        .unwrap();
    wait_for(
        "block 0",
        || router.view().blocks.contains(&(want[0], GPU)),
        || poke(&p),
    )
    .await;
    let snaps = router.view().snapshots;
    p.skip_seq(3).await;
    p.publish(vec![stored(&[9], Some(8), &toks[16..])])
        .await
        .unwrap();
    wait_for(
        "unrecovered gap counted",
        || agent.stats().gaps_unrecovered.get() >= 1 && agent.stats().unknown_parents.get() >= 1,
        || async {},
    )
    .await;
    wait_for(
        "a fresh snapshot",
        || router.view().snapshots > snaps,
        || async {},
    )
    .await;
    assert!(
        !router.view().blocks.contains(&(want[1], GPU)),
        "never guessed"
    );
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_restart_clears_the_worker() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let p = publisher(PayloadForm::Map, true, true).await;
    let agent = Agent::start(agent_config(&p, vec![router.url()]), None)
        .await
        .unwrap();
    let old = tokens(1, 1000);
    p.publish(vec![stored(&[1], None, &old)]).await.unwrap();
    wait_for(
        "old block",
        || router.view().blocks.contains(&(wp(&old)[0], GPU)),
        || poke(&p),
    )
    .await;
    for _ in 0..3 {
        poke(&p).await;
    }
    p.restart().await;
    let new = tokens(1, 2000);
    p.publish(vec![stored(&[5], None, &new)]).await.unwrap();
    wait_for(
        "only the new block",
        || {
            let v = router.view();
            v.blocks.contains(&(wp(&new)[0], GPU)) && !v.blocks.contains(&(wp(&old)[0], GPU))
        },
        || async {},
    )
    .await;
    assert_eq!(agent.stats().engine_restarts.get(), 1);
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_counted_and_skipped() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let p = publisher(PayloadForm::Map, true, true).await;
    let agent = Agent::start(agent_config(&p, vec![router.url()]), None)
        .await
        .unwrap();
    wait_for(
        "agent hears the engine",
        || agent.stats().batches.get() > 0,
        || poke(&p),
    )
    .await;
    let topic = Bytes::from_static(b"kv");
    p.send_raw(vec![topic.clone()]).await.unwrap();
    p.send_raw(vec![
        topic.clone(),
        Bytes::from_static(b"\x01\x02"),
        Bytes::from_static(b"x"),
    ])
    .await
    .unwrap();
    p.publish_payload(Bytes::from_static(b"\xc1\xff garbage"))
        .await
        .unwrap();
    p.publish_payload(Bytes::from_static(b"\x93\xcb\x3f"))
        .await
        .unwrap(); // truncated
    p.publish_payload(Bytes::from_static(b"\x93\x00\x91\x91\xa3Bad\xc0"))
        .await
        .unwrap(); // unknown tag
    let toks = tokens(1, 5);
    p.publish(vec![stored(&[1], None, &toks)]).await.unwrap();
    wait_for(
        "the good batch after the garbage",
        || router.view().blocks.contains(&(wp(&toks)[0], GPU)),
        || async {},
    )
    .await;
    assert_eq!(agent.stats().bad_frames.get(), 2);
    assert_eq!(agent.stats().bad_payloads.get(), 3);
    assert_eq!(
        agent.stats().gaps.get(),
        0,
        "bad payloads still consume their seq"
    );
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_restart_gets_a_full_snapshot_again() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let addr: SocketAddr = router.addr;
    let p = publisher(PayloadForm::Map, true, true).await;
    let mut cfg = agent_config(&p, vec![router.url()]);
    cfg.agent_token = Some("s3cret".into());
    let agent = Agent::start(cfg, None).await.unwrap();
    let toks = tokens(4, 0);
    let want = wp(&toks);
    p.publish(vec![stored(&[1, 2, 3, 4], None, &toks)])
        .await
        .unwrap();
    wait_for("4 blocks", || router.view().blocks.len() == 4, || poke(&p)).await;
    assert_eq!(router.view().tokens[0].as_deref(), Some("Bearer s3cret"));
    router.stop().await;
    let router = TestRouter::start(addr, None).await;
    wait_for(
        "the restarted router is complete again",
        || {
            let v = router.view();
            want.iter().all(|h| v.blocks.contains(&(*h, GPU))) && v.snapshots >= 1
        },
        || async {},
    )
    .await;
    assert!(agent.stats().router_connects.get() >= 2);
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_size_mismatch_is_refused_and_counted() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), Some(32)).await;
    let p = publisher(PayloadForm::Map, true, true).await;
    let agent = Agent::start(agent_config(&p, vec![router.url()]), None)
        .await
        .unwrap();
    p.publish(vec![stored(&[1], None, &tokens(1, 0))])
        .await
        .unwrap();
    wait_for(
        "a refusal",
        || agent.stats().router_refusals.get() >= 1,
        || poke(&p),
    )
    .await;
    assert!(router.view().blocks.is_empty());
    agent.shutdown().await;
    router.stop().await;
}

/// Binds a publisher on `endpoint`/`replay` again once the old one let go of
/// the ports.
async fn rebind(endpoint: &str, replay: Option<&str>) -> KvEventPublisher {
    common::poll::poll(
        "the ports free again",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let mut c = PublisherConfig::new(endpoint);
            c.topic = "kv".into();
            c.replay_endpoint = replay.map(str::to_owned);
            KvEventPublisher::bind(c).await.ok()
        },
    )
    .await
}

/// Waits until the restarted engine `p` has the agent subscribed again (its
/// SUBSCRIBE lands a moment after the connection).
async fn resubscribed(p: &KvEventPublisher) {
    wait_for(
        "the agent connected to the new engine",
        || p.subscribers_accepted() > 0,
        || async {},
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Whether the router holds `new` blocks and none of `old`.
fn only_new(router: &TestRouter, new: &[&[u32]], old: &[u32]) -> bool {
    let v = router.view();
    new.iter().all(|t| v.blocks.contains(&(wp(t)[0], GPU)))
        && !v.blocks.contains(&(wp(old)[0], GPU))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_load_scraping_a_restart_meeting_the_old_sequence_is_not_a_duplicate() {
    // Load scraping is off (`agent_config`): only the event stream can tell.
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let p1 = publisher(PayloadForm::Map, true, true).await;
    let (endpoint, replay) = (
        p1.endpoint().to_owned(),
        p1.replay_endpoint().unwrap().to_owned(),
    );
    let agent = Agent::start(agent_config(&p1, vec![router.url()]), None)
        .await
        .unwrap();
    // The old engine publishes one batch (seq 0): live, or from the start-up
    // replay.
    let old = tokens(1, 5000);
    p1.publish(vec![stored(&[1], None, &old)]).await.unwrap();
    wait_for(
        "old block",
        || router.view().blocks.contains(&(wp(&old)[0], GPU)),
        || async {},
    )
    .await;
    drop(p1);
    let p2 = rebind(&endpoint, Some(&replay)).await;
    resubscribed(&p2).await;
    // The new engine's seq 0 and 1: before, seq 0 was dropped as a duplicate
    // of the old engine's, and the old block was kept for good.
    let (b, c) = (tokens(1, 6000), tokens(1, 7000));
    p2.publish(vec![stored(&[7], None, &b)]).await.unwrap();
    p2.publish(vec![stored(&[8], None, &c)]).await.unwrap();
    wait_for(
        "the new engine's blocks, the old one forgotten",
        || only_new(&router, &[&b, &c], &old),
        || async {},
    )
    .await;
    let s = agent.stats();
    assert_eq!(s.engine_restarts.get(), 1);
    assert_eq!(s.gaps_unrecovered.get(), 0);
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_load_scraping_or_replay_a_restart_past_the_old_sequence_is_not_a_gap() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let p1 = publisher(PayloadForm::Map, false, true).await;
    let endpoint = p1.endpoint().to_owned();
    let agent = Agent::start(agent_config(&p1, vec![router.url()]), None)
        .await
        .unwrap();
    wait_for(
        "agent hears the engine",
        || agent.stats().batches.get() > 0,
        || poke(&p1),
    )
    .await;
    let old = tokens(1, 5000);
    let last = p1.publish(vec![stored(&[1], None, &old)]).await.unwrap();
    wait_for(
        "old block",
        || router.view().blocks.contains(&(wp(&old)[0], GPU)),
        || async {},
    )
    .await;
    drop(p1);
    let p2 = rebind(&endpoint, None).await;
    resubscribed(&p2).await;
    // The new engine published past the old sequence while the agent was
    // reconnecting (lost: no replay). Before, its next batch read as a gap
    // in the old engine's stream, and the old block was kept for good.
    p2.skip_seq(last + 3).await;
    let b = tokens(1, 6000);
    p2.publish(vec![stored(&[7], None, &b)]).await.unwrap();
    wait_for(
        "the new engine's block, the old one forgotten",
        || only_new(&router, &[&b], &old),
        || async {},
    )
    .await;
    let s = agent.stats();
    assert_eq!(s.engine_restarts.get(), 1);
    assert_eq!(s.gaps.get(), 0);
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_publisher_is_followed_again_by_the_same_subscription() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let p1 = publisher(PayloadForm::Map, true, true).await;
    let (endpoint, replay) = (
        p1.endpoint().to_owned(),
        p1.replay_endpoint().unwrap().to_owned(),
    );
    let agent = Agent::start(agent_config(&p1, vec![router.url()]), None)
        .await
        .unwrap();
    let old = tokens(1, 3000);
    p1.publish(vec![stored(&[1], None, &old)]).await.unwrap();
    wait_for(
        "old block",
        || router.view().blocks.contains(&(wp(&old)[0], GPU)),
        || poke(&p1),
    )
    .await;
    // A sequence well past what the restarted engine reaches below, so its
    // batches read as a restart, not a gap.
    for _ in 0..20 {
        poke(&p1).await;
    }
    let seen = p1.next_seq().await;
    wait_for(
        "every batch applied",
        || agent.stats().batches.get() >= seen,
        || async {},
    )
    .await;
    // Idle for longer than the old 3 s silence timer, which re-created the
    // socket (a second subscriber connection); absence needs the wait.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(p1.subscribers_accepted(), 1, "the idle agent re-subscribed");

    drop(p1); // the engine stops; it comes back on the same ports from seq 0
    let p2 = rebind(&endpoint, Some(&replay)).await;
    let new = tokens(1, 4000);
    p2.publish(vec![stored(&[7], None, &new)]).await.unwrap();
    wait_for(
        "the new engine's block, the old one forgotten",
        || {
            let v = router.view();
            v.blocks.contains(&(wp(&new)[0], GPU)) && !v.blocks.contains(&(wp(&old)[0], GPU))
        },
        // Once it is subscribed again (the first one may beat its
        // subscription), and not so often that the new sequence passes the old.
        || async {
            if p2.subscribers_accepted() > 0 && p2.next_seq().await < 10 {
                poke(&p2).await;
            }
        },
    )
    .await;
    assert_eq!(p2.subscribers_accepted(), 1, "one reconnect, not a loop");
    assert_eq!(agent.stats().event_reconnects.get(), 1);
    assert_eq!(agent.stats().engine_restarts.get(), 1);
    agent.shutdown().await;
    router.stop().await;
}

/// A hostile peer at the event endpoint: the ZMTP 3 handshake of a PUB
/// socket, then one message frame announcing 2^62 bytes. Returns the
/// connection (held open, as if the body were coming).
async fn hostile_pub(l: &tokio::net::TcpListener) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut s, _) = tokio::time::timeout(Duration::from_secs(30), l.accept())
        .await
        .expect("the agent dialled the event endpoint")
        .unwrap();
    let mut greeting = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    greeting.extend_from_slice(b"NULL");
    greeting.resize(64, 0);
    s.write_all(&greeting).await.unwrap();
    let mut theirs = [0u8; 64];
    s.read_exact(&mut theirs).await.unwrap();
    let mut ready = vec![5u8];
    ready.extend_from_slice(b"READY");
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    ready.extend_from_slice(&3u32.to_be_bytes());
    ready.extend_from_slice(b"PUB");
    s.write_all(&[0x04, ready.len() as u8]).await.unwrap();
    s.write_all(&ready).await.unwrap();
    // Their READY and SUBSCRIBE: the handshake is done.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut huge = vec![0x02u8];
    huge.extend_from_slice(&(1u64 << 62).to_be_bytes());
    s.write_all(&huge).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_announcing_a_huge_frame_cannot_abort_the_agent_which_follows_the_next_publisher() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let hostile = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", hostile.local_addr().unwrap());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["--worker-id", "w1", "--model", "m"])
        .args(["--engine-url", "http://127.0.0.1:9", "--topic", "kv"])
        .args(["--kv-events", &endpoint, "--load-interval-ms", "0"])
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let http: SocketAddr = loop {
        let l = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("agent did not start within 30 s")
            .unwrap()
            .expect("agent exited");
        if let Some(a) = l.strip_prefix("warmpath-agent listening on http://") {
            break a.parse().unwrap();
        }
    };

    let mut attack = hostile_pub(&hostile).await;
    // The agent cuts the hostile connection (read: EOF), and lives.
    let mut rest = [0u8; 4096];
    let cut = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match attack.read(&mut rest).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the agent died: {:?}",
        child.try_wait()
    );
    assert!(cut.is_ok(), "the hostile connection was not cut");
    let live = reqwest::get(format!("http://{http}/livez")).await.unwrap();
    assert_eq!(live.status(), 200);
    let metrics = reqwest::get(format!("http://{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("warmpath_agent_bad_messages_total{reason=\"frame_too_long\"} 1"),
        "{metrics}"
    );

    // A well-behaved engine on the same endpoint is followed again.
    drop(attack);
    drop(hostile);
    let p = common::poll::poll(
        "the port free again",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let mut c = PublisherConfig::new(endpoint.as_str());
            c.topic = "kv".into();
            KvEventPublisher::bind(c).await.ok()
        },
    )
    .await;
    let toks = tokens(2, 9000);
    common::poll::poll(
        "a batch from the new publisher",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            if p.subscribers_accepted() > 0 {
                p.publish(vec![stored(&[1, 2], None, &toks)]).await.unwrap();
            }
            let h: serde_json::Value = reqwest::get(format!("http://{http}/health"))
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (h["batches"].as_u64()? >= 1 && h["blocks"] == 2).then_some(())
        },
    )
    .await;
    assert!(child.try_wait().unwrap().is_none());
}
