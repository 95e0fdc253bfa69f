#![allow(clippy::unwrap_used)]
//! Ingest tests: the state machine directly, then a real tonic server on
//! 127.0.0.1:0 with a real client stream.

use super::stream::WorkerStream;
use super::*;
use crate::routing::loads::AgentLoads;
use std::collections::HashSet;
use warmpath_core::{hash_tokens, BlockHash, CacheIndex, HashSeed, Tier};
use warmpath_proto::v1::{
    self, delta, router_message, Block, Delta, Hello, Load, SnapshotChunk, Stored,
};

struct OnePool(IngestPool);

impl PoolDirectory for OnePool {
    fn pool(&self, model: &str) -> Option<IngestPool> {
        (model == "m").then(|| self.0.clone())
    }
    fn pools(&self) -> Vec<IngestPool> {
        vec![self.0.clone()]
    }
}

fn pool() -> IngestPool {
    IngestPool {
        model: "m".into(),
        index: Arc::new(CacheIndex::new()),
        block_size: 4,
        known_workers: None,
        bounds: crate::config::IndexSettings::default(),
    }
}

fn hello(worker: &str, epoch: u64, bs: u32) -> Hello {
    Hello {
        worker_id: worker.into(),
        endpoint: "http://127.0.0.1:1".into(),
        model: "m".into(),
        block_size: bs,
        epoch,
        agent_version: "test".into(),
        dp_rank: 0,
        partial: false,
    }
}

fn chain(n: u32) -> Vec<BlockHash> {
    hash_tokens(
        HashSeed::new("m", "", ""),
        4,
        &(0..n * 4).collect::<Vec<_>>(),
    )
}

fn snapshot(seq: u64, hs: &[BlockHash], chunk: usize) -> Vec<AgentMessage> {
    let mut chunks: Vec<&[BlockHash]> = hs.chunks(chunk).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let n = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, c)| AgentMessage {
            msg: Some(Msg::Snapshot(SnapshotChunk {
                seq,
                chunk_index: i as u32,
                first: i == 0,
                last: i + 1 == n,
                blocks: c
                    .iter()
                    .map(|h| Block {
                        hash: h.0,
                        parent: None,
                        tier: v1::Tier::Gpu as i32,
                    })
                    .collect(),
                total_blocks: hs.len() as u64,
                prefix_closed: false,
            })),
        })
        .collect()
}

fn stored(seq: u64, hs: &[BlockHash]) -> AgentMessage {
    AgentMessage {
        msg: Some(Msg::Delta(Delta {
            seq,
            op: Some(delta::Op::Stored(Stored {
                parent: None,
                hashes: hs.iter().map(|h| h.0).collect(),
                tier: v1::Tier::Gpu as i32,
            })),
            observed_unix_micros: 0,
            prefix_closed: false,
        })),
    }
}

fn is_resend(m: &[RouterMessage]) -> bool {
    matches!(
        m.first().and_then(|m| m.msg.as_ref()),
        Some(router_message::Msg::ResendSnapshot(_))
    )
}

#[test]
fn snapshot_then_deltas_then_gap() {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let mut ws = WorkerStream::open(p.clone(), agents.clone(), &hello("w", 1, 4), 0).unwrap();
    let c = chain(10);
    // Deltas before any snapshot are ignored.
    assert!(ws.on_message(stored(1, &c[..1]), 1, 0).unwrap().is_empty());
    let mut out = vec![];
    for m in snapshot(5, &c[..4], 3) {
        out = ws.on_message(m, 1, 0).unwrap();
    }
    assert!(matches!(
        out[0].msg,
        Some(router_message::Msg::Ack(v1::Ack { seq: 5 }))
    ));
    let slot = p.index.worker_slot("w").unwrap();
    assert_eq!(p.index.longest_match(&c).of(slot).unwrap().blocks, 4);
    ws.on_message(stored(6, &c[4..6]), 2, 0).unwrap();
    assert_eq!(p.index.longest_match(&c).of(slot).unwrap().blocks, 6);
    // duplicate ignored
    ws.on_message(stored(6, &c[6..7]), 2, 0).unwrap();
    assert_eq!(p.index.longest_match(&c).of(slot).unwrap().blocks, 6);
    // gap: resend, and later deltas are not applied
    assert!(is_resend(
        &ws.on_message(stored(8, &c[6..8]), 3, 0).unwrap()
    ));
    ws.on_message(stored(9, &c[6..8]), 3, 0).unwrap();
    assert_eq!(p.index.longest_match(&c).of(slot).unwrap().blocks, 6);
    // a fresh snapshot replaces everything
    for m in snapshot(20, &c[..2], 8) {
        ws.on_message(m, 4, 0).unwrap();
    }
    assert_eq!(p.index.longest_match(&c).of(slot).unwrap().blocks, 2);
    assert_eq!(p.index.block_count(slot), 2);
    assert_eq!(agents.status_of("m", "w", 4).unwrap().last_seq, Some(20));
}

/// The agent's word on prefix closure reaches the index: a closed snapshot
/// makes the claim, an open delta withdraws it, a closed one makes it again.
#[test]
fn prefix_closure_follows_the_agents_word() {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let mut ws = WorkerStream::open(p.clone(), agents, &hello("w", 1, 4), 0).unwrap();
    let c = chain(40);
    let slot = p.index.worker_slot("w").unwrap();
    let closed = |m: AgentMessage| match m.msg {
        Some(Msg::Snapshot(s)) => AgentMessage {
            msg: Some(Msg::Snapshot(SnapshotChunk {
                prefix_closed: s.last,
                ..s
            })),
        },
        Some(Msg::Delta(d)) => AgentMessage {
            msg: Some(Msg::Delta(Delta {
                prefix_closed: true,
                ..d
            })),
        },
        other => AgentMessage { msg: other },
    };
    for m in snapshot(1, &c[..30], 8) {
        ws.on_message(closed(m), 1, 0).unwrap();
    }
    assert!(p.index.is_prefix_closed(slot));
    assert_eq!(p.index.longest_match(&c).of(slot).unwrap().blocks, 30);
    // A segment below a block the worker lacks: the agent says open.
    ws.on_message(stored(2, &c[31..40]), 2, 0).unwrap();
    assert!(!p.index.is_prefix_closed(slot));
    assert_eq!(p.index.longest_match(&c).of(slot).unwrap().blocks, 30);
    ws.on_message(closed(stored(3, &c[30..31])), 3, 0).unwrap();
    assert!(p.index.is_prefix_closed(slot));
    assert_eq!(p.index.longest_match(&c).of(slot).unwrap().blocks, 40);
    // A snapshot that does not say so leaves the claim withdrawn.
    for m in snapshot(9, &c[..10], 8) {
        ws.on_message(m, 4, 0).unwrap();
    }
    assert!(!p.index.is_prefix_closed(slot));
    // A closed snapshot cut at the worker's cap has holes: no claim.
    p.index.set_worker_cap(slot, Some(12)).unwrap();
    for m in snapshot(10, &c[..20], 8) {
        ws.on_message(closed(m), 5, 0).unwrap();
    }
    assert_eq!(p.index.block_count(slot), 12);
    assert!(!p.index.is_prefix_closed(slot));
    for m in snapshot(11, &c[..12], 8) {
        ws.on_message(closed(m), 6, 0).unwrap();
    }
    assert!(p.index.is_prefix_closed(slot), "within the cap it holds");
}

#[test]
fn block_size_mismatch_and_old_epoch_are_refused() {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let err = WorkerStream::open(p.clone(), agents.clone(), &hello("w", 1, 16), 0)
        .err()
        .unwrap();
    assert!(err.reason.contains("block size mismatch"), "{}", err.reason);
    assert!(!err.retryable);
    let new = WorkerStream::open(p.clone(), agents.clone(), &hello("w", 5, 4), 0).unwrap();
    let err = WorkerStream::open(p.clone(), agents.clone(), &hello("w", 4, 4), 0)
        .err()
        .unwrap();
    assert!(err.reason.contains("older"), "{}", err.reason);
    // Once the newer stream is gone, an older epoch is not locked out (a
    // restart on a host whose clock is behind).
    new.close();
    assert!(WorkerStream::open(p.clone(), agents.clone(), &hello("w", 4, 4), 0).is_ok());
    // block size 0 (not learned yet) is accepted
    assert!(WorkerStream::open(p, agents, &hello("x", 1, 0), 0).is_ok());
}

fn hello_msg(h: Hello) -> AgentMessage {
    AgentMessage {
        msg: Some(Msg::Hello(h)),
    }
}

#[test]
fn a_stream_publishes_only_for_the_worker_it_said_hello_with() {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let mut ws = WorkerStream::open(p.clone(), agents.clone(), &hello("w", 1, 0), 0).unwrap();
    for m in snapshot(1, &chain(2), 8) {
        ws.on_message(m, 1, 0).unwrap();
    }
    for other in [hello("x", 1, 4), hello("w", 2, 4)] {
        let err = ws.on_message(hello_msg(other), 2, 0).unwrap_err();
        assert!(
            err.reason.contains("only change block_size"),
            "{}",
            err.reason
        );
    }
    assert!(p.index.worker_slot("x").is_none(), "nothing stored for x");
    // The same identity may announce the block size it learned.
    assert!(ws.on_message(hello_msg(hello("w", 1, 4)), 3, 0).is_ok());
}

#[test]
fn only_the_pools_backends_may_publish() {
    let mut p = pool();
    p.known_workers = Some(vec!["gpu-0".to_owned()].into());
    let agents = Arc::new(Agents::default());
    let err = WorkerStream::open(p.clone(), agents.clone(), &hello("gpu-9", 1, 4), 0)
        .err()
        .unwrap();
    assert!(err.reason.contains("not a backend"), "{}", err.reason);
    assert!(err.reason.contains("gpu-0"), "names the ids it accepts");
    assert!(
        agents.status_of("m", "gpu-9", 0).is_none(),
        "refusals add no agent"
    );
    assert!(WorkerStream::open(p, agents, &hello("gpu-0", 1, 4), 0).is_ok());
}

#[test]
fn a_learned_block_size_mismatch_is_refused_cleared_and_shown() {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let mut ws = WorkerStream::open(p.clone(), agents.clone(), &hello("w", 1, 0), 0).unwrap();
    for m in snapshot(1, &chain(3), 8) {
        ws.on_message(m, 1, 0).unwrap();
    }
    let slot = p.index.worker_slot("w").unwrap();
    assert_eq!(p.index.block_count(slot), 3);
    let err = ws
        .on_message(hello_msg(hello("w", 1, 16)), 2, 0)
        .unwrap_err();
    assert!(err.reason.contains("block size mismatch"), "{}", err.reason);
    assert!(!err.retryable);
    assert_eq!(
        p.index.block_count(slot),
        0,
        "entries of the wrong size dropped"
    );
    let st = agents.status_of("m", "w", 3).unwrap();
    assert!(st.refused.unwrap().contains("16"));
    // Reconnecting with the same mismatch keeps it visible.
    ws.close();
    assert!(WorkerStream::open(p, agents.clone(), &hello("w", 1, 16), 4).is_err());
    assert!(agents.status_of("m", "w", 5).unwrap().refused.is_some());
}

#[test]
fn a_newer_stream_takes_over_and_the_old_one_is_closed() {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let mut old = WorkerStream::open(p.clone(), agents.clone(), &hello("w", 1, 4), 0).unwrap();
    let _new = WorkerStream::open(p.clone(), agents.clone(), &hello("w", 2, 4), 0).unwrap();
    assert!(old.on_message(stored(1, &chain(1)), 1, 0).is_err());
}

#[test]
fn aborted_or_incomplete_snapshots_ask_again() {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let mut ws = WorkerStream::open(p.clone(), agents, &hello("w", 1, 4), 0).unwrap();
    let c = chain(6);
    let mut chunks = snapshot(3, &c, 2);
    chunks.swap(1, 2);
    let mut answers = vec![];
    for m in chunks {
        answers.extend(ws.on_message(m, 1, 0).unwrap());
    }
    assert!(is_resend(&answers));
    let slot = p.index.worker_slot("w").unwrap();
    assert_eq!(p.index.block_count(slot), 0, "nothing applied");
}

#[test]
fn sweeper_marks_stale_then_clears() {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let mut ws = WorkerStream::open(p.clone(), agents, &hello("w", 1, 4), 1_000).unwrap();
    for m in snapshot(1, &chain(3), 8) {
        ws.on_message(m, 1_000, 0).unwrap();
    }
    let dir = OnePool(p.clone());
    let mut cleared = HashSet::new();
    let stale = |now| p.index.worker_stats(now).iter().filter(|w| w.stale).count();
    let newly = sweeper::sweep(
        &dir,
        Duration::from_secs(10),
        Duration::from_secs(60),
        5_000,
        &mut cleared,
    );
    assert_eq!((stale(5_000), newly), (0, 0));
    let newly = sweeper::sweep(
        &dir,
        Duration::from_secs(10),
        Duration::from_secs(60),
        20_000,
        &mut cleared,
    );
    assert_eq!((stale(20_000), newly), (1, 0));
    let slot = p.index.worker_slot("w").unwrap();
    assert!(!p.index.longest_match(&chain(3)).of(slot).unwrap().fresh);
    let newly = sweeper::sweep(
        &dir,
        Duration::from_secs(10),
        Duration::from_secs(60),
        70_000,
        &mut cleared,
    );
    assert_eq!(newly, 1);
    assert_eq!(p.index.block_count(slot), 0);
    let newly = sweeper::sweep(
        &dir,
        Duration::from_secs(10),
        Duration::from_secs(60),
        80_000,
        &mut cleared,
    );
    assert_eq!(newly, 0, "cleared once");
}

async fn start_server(
    secret: Option<&str>,
) -> (
    std::net::SocketAddr,
    IngestPool,
    Arc<Agents>,
    CancellationToken,
) {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let shutdown = CancellationToken::new();
    let svc = IngestService::new(
        Arc::new(OnePool(p.clone())),
        agents.clone(),
        AgentAuth::new(secret.map(str::to_owned)),
        shutdown.clone(),
    )
    .with_hello_within(Duration::from_millis(300));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = server(None)
        .unwrap()
        .add_service(CacheEventsServer::new(svc));
    let incoming = TcpListenerStream::new(listener);
    tokio::spawn(router.serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned()));
    (addr, p, agents, shutdown)
}

async fn open(
    addr: std::net::SocketAddr,
    token: Option<&str>,
    msgs: Vec<AgentMessage>,
) -> Result<(mpsc::Sender<AgentMessage>, Streaming<RouterMessage>), Status> {
    let mut client = warmpath_proto::CacheEventsClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(64);
    for m in msgs {
        tx.send(m).await.unwrap();
    }
    let mut req = Request::new(ReceiverStream::new(rx));
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", warmpath_proto::bearer(t).parse().unwrap());
    }
    let resp = client.publish(req).await?;
    Ok((tx, resp.into_inner()))
}

#[tokio::test]
async fn grpc_end_to_end_with_token() {
    let (addr, p, agents, shutdown) = start_server(Some("s3cret")).await;
    // wrong token refused
    let err = open(addr, Some("nope"), vec![]).await.err().unwrap();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = open(addr, None, vec![]).await.err().unwrap();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    // right token: hello + snapshot + delta + load
    let c = chain(8);
    let mut msgs = vec![AgentMessage {
        msg: Some(Msg::Hello(hello("w1", 7, 4))),
    }];
    msgs.extend(snapshot(1, &c[..5], 2));
    msgs.push(stored(2, &c[5..8]));
    msgs.push(AgentMessage {
        msg: Some(Msg::Load(Load {
            running: 3,
            waiting: 1,
            kv_usage: 0.5,
            engine_up: true,
            capacity_blocks: 0,
            partial: false,
        })),
    });
    let credential = warmpath_proto::worker_token("s3cret", "w1");
    let (tx, mut answers) = open(addr, Some(&credential), msgs).await.unwrap();
    let first = answers.next().await.unwrap().unwrap();
    assert!(matches!(
        first.msg,
        Some(router_message::Msg::Ack(v1::Ack { seq: 1 }))
    ));
    let slot = loop {
        if let Some(s) = p.index.worker_slot("w1") {
            if p.index.block_count(s) == 8 {
                break s;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(p.index.longest_match(&c).of(slot).unwrap().blocks, 8);
    for _ in 0..100 {
        if agents.engine_load("m", "w1").is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(agents.engine_load("m", "w1").unwrap().running, 3);
    drop(tx);
    // disconnect is recorded
    for _ in 0..100 {
        if !agents.status_of("m", "w1", 0).unwrap().connected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!agents.status_of("m", "w1", 0).unwrap().connected);
    // entries stay after a disconnect (until stale/expired)
    assert_eq!(p.index.block_count(slot), 8);
    shutdown.cancel();
}

#[tokio::test]
async fn grpc_unknown_model_and_bad_first_message_are_refused() {
    let (addr, _p, _agents, shutdown) = start_server(None).await;
    let mut h = hello("w", 1, 4);
    h.model = "other".into();
    let (_tx, mut answers) = open(
        addr,
        None,
        vec![AgentMessage {
            msg: Some(Msg::Hello(h)),
        }],
    )
    .await
    .unwrap();
    match answers.next().await.unwrap().unwrap().msg {
        Some(router_message::Msg::Refused(r)) => {
            assert!(r.reason.contains("no pool serves model"), "{}", r.reason);
            assert!(!r.retryable);
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    let (_tx, mut answers) = open(addr, None, vec![stored(1, &chain(1))]).await.unwrap();
    assert!(matches!(
        answers.next().await.unwrap().unwrap().msg,
        Some(router_message::Msg::Refused(_))
    ));
    shutdown.cancel();
}

#[tokio::test]
async fn a_stream_without_hello_is_refused_at_its_deadline() {
    let (addr, _p, _agents, shutdown) = start_server(None).await;
    let (_tx, mut answers) = open(addr, None, vec![]).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), answers.next())
        .await
        .expect("answered within the deadline");
    match first.unwrap().unwrap().msg {
        Some(router_message::Msg::Refused(r)) => {
            assert!(r.reason.contains("no Hello within 300 ms"), "{}", r.reason);
            assert!(r.retryable);
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    // And the stream ends there.
    let end = tokio::time::timeout(Duration::from_secs(5), answers.next()).await;
    assert!(matches!(end, Ok(None | Some(Err(_)))), "{end:?}");
    shutdown.cancel();
}

#[tokio::test]
async fn a_silent_stream_taken_over_is_closed_without_its_next_message() {
    let (addr, _p, agents, shutdown) = start_server(None).await;
    let hello_of = |epoch| AgentMessage {
        msg: Some(Msg::Hello(hello("w", epoch, 4))),
    };
    let (_old_tx, mut old) = open(addr, None, vec![hello_of(1)]).await.unwrap();
    for _ in 0..200 {
        if agents.status_of("m", "w", 0).is_some_and(|s| s.connected) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_new_tx, _new) = open(addr, None, vec![hello_of(2)]).await.unwrap();
    // The old stream sends nothing more; within the owner check it is told
    // why, as its next message would have been, and closed.
    let told = tokio::time::timeout(Duration::from_secs(5), old.next())
        .await
        .expect("the old stream was answered");
    match told.unwrap().unwrap().msg {
        Some(router_message::Msg::Refused(r)) => {
            assert!(r.reason.contains("took over"), "{}", r.reason);
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    let end = tokio::time::timeout(Duration::from_secs(5), old.next())
        .await
        .expect("the old stream ended");
    assert!(matches!(end, None | Some(Err(_))), "{end:?}");
    shutdown.cancel();
}

#[test]
fn tiers_map_from_proto() {
    let p = pool();
    let agents = Arc::new(Agents::default());
    let mut ws = WorkerStream::open(p.clone(), agents, &hello("w", 1, 4), 0).unwrap();
    for m in snapshot(1, &[], 8) {
        ws.on_message(m, 0, 0).unwrap();
    }
    let c = chain(2);
    let m = AgentMessage {
        msg: Some(Msg::Delta(Delta {
            seq: 2,
            op: Some(delta::Op::Stored(Stored {
                parent: None,
                hashes: c.iter().map(|h| h.0).collect(),
                tier: v1::Tier::Cpu as i32,
            })),
            observed_unix_micros: 1,
            prefix_closed: false,
        })),
    };
    ws.on_message(m, 0, 10).unwrap();
    assert_eq!(
        p.index.holders_of(c[0]),
        vec![("w".to_string(), vec![Tier::Cpu])]
    );
}

fn load(capacity_blocks: u64) -> AgentMessage {
    AgentMessage {
        msg: Some(Msg::Load(Load {
            running: 0,
            waiting: 0,
            kv_usage: 0.5,
            engine_up: true,
            capacity_blocks,
            partial: false,
        })),
    }
}

#[test]
fn reported_capacity_caps_the_worker_and_the_excess_is_refused() {
    let mut p = pool();
    p.bounds.max_entries = 48; // a worker's ceiling: 12
    let agents = Arc::new(Agents::default());
    let mut ws = WorkerStream::open(p.clone(), agents.clone(), &hello("w", 1, 4), 0).unwrap();
    let slot = p.index.worker_slot("w").unwrap();
    // No capacity known yet: the ceiling, for snapshots too.
    assert_eq!(p.index.worker_cap(slot), Some(12));
    let c = chain(40);
    let mut out = vec![];
    for m in snapshot(1, &c[..20], 7) {
        out = ws.on_message(m, 1, 0).unwrap();
    }
    assert!(!is_resend(&out), "{out:?}");
    assert_eq!(p.index.block_count(slot), 12);
    // A reported capacity of 4: cap 5 (x 1.25); the held 12 stay, nothing
    // new lands.
    ws.on_message(load(4), 2, 0).unwrap();
    assert_eq!(p.index.worker_cap(slot), Some(5));
    ws.on_message(stored(2, &c[20..30]), 3, 0).unwrap();
    assert_eq!(p.index.block_count(slot), 12);
    // A huge claimed capacity is held to the ceiling, in the index
    // and in the load the policy models the engine's cache from.
    ws.on_message(load(u64::MAX), 4, 0).unwrap();
    assert_eq!(p.index.worker_cap(slot), Some(12));
    assert_eq!(
        agents.engine_load("m", "w").unwrap().capacity_blocks,
        Some(12)
    );
}

#[test]
fn compaction_runs_on_its_interval() {
    let p = pool();
    let slot = p.index.register_worker("w").unwrap();
    p.index.store(slot, Tier::Gpu, &chain(10)).unwrap();
    p.index.clear_worker(slot).unwrap();
    assert_eq!(p.index.distinct_blocks(), 10);
    let dir = OnePool(p.clone());
    let mut last = Vec::new();
    assert_eq!(sweeper::compact_due(&dir, 5_000, &mut last), 0);
    assert_eq!(sweeper::compact_due(&dir, 34_999, &mut last), 0);
    assert_eq!(sweeper::compact_due(&dir, 35_000, &mut last), 10);
    assert_eq!(p.index.distinct_blocks(), 0);
}

#[test]
fn memory_is_released_once_the_indexes_shrank_enough() {
    let step = sweeper::RELEASE_AFTER_BYTES;
    let mut high = 0;
    // Growing, or shrinking by less than the step: nothing to give back.
    assert!(!sweeper::release_due(&mut high, 10 * step));
    assert!(!sweeper::release_due(&mut high, 9 * step + 1));
    // A big clear: release once, then not again until the next drop.
    assert!(sweeper::release_due(&mut high, step / 2));
    assert!(!sweeper::release_due(&mut high, step / 2));
    assert!(!sweeper::release_due(&mut high, 0));
    assert!(!sweeper::release_due(&mut high, 2 * step));
    assert!(sweeper::release_due(&mut high, step));
}

#[test]
fn a_logged_id_is_cut_at_a_char_boundary() {
    assert_eq!(shown("w1"), "\"w1\"");
    let long = "é".repeat(200);
    let s = shown(&long);
    assert!(
        s.starts_with(&format!("\"{}\"", "é".repeat(guard::SHOWN_CHARS))),
        "{s}"
    );
    assert!(s.ends_with("(400 bytes)"), "{s}");
}
