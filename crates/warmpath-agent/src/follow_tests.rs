#![allow(clippy::unwrap_used)]

use super::*;
use warmpath_vllm_events::{
    encode_batch, BlockStored, EngineBlockHash, KvEvent, KvEventPublisher, Medium, PayloadForm,
    PublisherConfig,
};

/// One batch storing engine block `h` (16 tokens offset by `h`), stamped `ts`.
fn payload(h: u64, ts: f64) -> Bytes {
    let ev = KvEvent::BlockStored(BlockStored {
        block_hashes: vec![EngineBlockHash::Int(h)],
        parent_block_hash: None,
        token_ids: (0..16).map(|t| t + h as u32 * 100).collect(),
        block_size: 16,
        medium: Some(Medium::Gpu),
        ..Default::default()
    });
    let batch = KvEventBatch {
        ts,
        events: vec![ev],
        dp_rank: Some(0),
    };
    Bytes::from(encode_batch(&batch, PayloadForm::Map))
}

fn live(seq: u64, payload: &Bytes) -> Vec<Bytes> {
    vec![
        Bytes::new(),
        Bytes::copy_from_slice(&seq.to_be_bytes()),
        payload.clone(),
    ]
}

fn follower(replay: Option<&str>) -> Follower {
    let cfg = FollowConfig {
        endpoint: "tcp://127.0.0.1:9".into(),
        replay_endpoint: replay.map(str::to_owned),
        topic: String::new(),
        rank: 0,
    };
    Follower::new(
        cfg,
        EngineTracker::new("m", 16),
        Arc::new(Hub::default()),
        Arc::new(Stats::default()),
        replay.map(str::to_owned),
    )
}

fn blocks(f: &Follower) -> usize {
    f.hub.status().1
}

#[tokio::test]
async fn a_start_up_replay_overlapping_live_batches_applies_each_once() {
    // A real replay ROUTER holding seq 0..=5; live batches 3..=7 then arrive
    // (3..=5 were published between subscribing and the replay).
    let mut c = PublisherConfig::new("tcp://127.0.0.1:0");
    c.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    let p = KvEventPublisher::bind(c).await.unwrap();
    let sent: Vec<Bytes> = (0..8u64).map(|h| payload(h, 1.0 + h as f64)).collect();
    for b in &sent[..6] {
        p.publish_payload(b.clone()).await.unwrap();
    }
    let mut f = follower(p.replay_endpoint());
    f.learn_buffered().await;
    assert_eq!((f.last, f.stats.batches.get()), (Some(5), 6));
    for (seq, b) in sent.iter().enumerate().skip(3) {
        f.on_live(live(seq as u64, b)).await;
    }
    assert_eq!(f.stats.batches.get(), 8, "each batch applied once");
    assert_eq!(f.stats.engine_restarts.get(), 0);
    assert_eq!(blocks(&f), 8);
    // The same duplicates after a reconnection are still duplicates.
    f.reconnected = true;
    f.on_live(live(7, &sent[7])).await;
    assert_eq!(f.stats.batches.get(), 8);
    assert_eq!(f.stats.engine_restarts.get(), 0);
}

#[tokio::test]
async fn a_known_sequence_number_with_other_bytes_is_a_restart() {
    let mut f = follower(None);
    for seq in 0..3u64 {
        f.on_live(live(seq, &payload(seq, 1.0))).await;
    }
    assert_eq!(blocks(&f), 3);
    // The new engine's seq 2 (== last) and 3: before, 2 was a duplicate.
    f.on_live(live(2, &payload(10, 2.0))).await;
    assert_eq!(f.stats.engine_restarts.get(), 1);
    assert_eq!(blocks(&f), 1, "the old engine's blocks forgotten");
    f.on_live(live(3, &payload(11, 2.1))).await;
    assert_eq!(blocks(&f), 2);
    assert_eq!(f.stats.engine_restarts.get(), 1);
    // Below `last`, never applied from this engine (its 0 and 1 were missed).
    f.on_live(live(0, &payload(12, 3.0))).await;
    assert_eq!(f.stats.engine_restarts.get(), 2);
}

#[tokio::test]
async fn after_a_reconnection_without_replay_only_the_next_sequence_is_the_same_engine() {
    let mut f = follower(None);
    for seq in 0..3u64 {
        f.on_live(live(seq, &payload(seq, 1.0))).await;
    }
    // A gap on the same connection: the same engine, lost batches.
    f.on_live(live(5, &payload(5, 1.0))).await;
    assert_eq!(f.stats.engine_restarts.get(), 0);
    assert_eq!(f.stats.gaps.get(), 1);
    // After a reconnection: the next batch continues the engine...
    f.reconnected = true;
    f.on_live(live(6, &payload(6, 1.0))).await;
    assert_eq!(f.stats.engine_restarts.get(), 0);
    assert_eq!(blocks(&f), 5);
    // ...a gap does not.
    f.reconnected = true;
    f.on_live(live(9, &payload(9, 2.0))).await;
    assert_eq!(f.stats.engine_restarts.get(), 1);
    assert_eq!(f.stats.gaps.get(), 1);
    assert_eq!(blocks(&f), 1);
}

#[tokio::test]
async fn after_a_reconnection_the_replay_buffer_tells_the_same_engine_from_a_new_one() {
    let mut c = PublisherConfig::new("tcp://127.0.0.1:0");
    c.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    let p = KvEventPublisher::bind(c).await.unwrap();
    let old: Vec<Bytes> = (0..3u64).map(|h| payload(h, 1.0)).collect();
    for b in &old {
        p.publish_payload(b.clone()).await.unwrap();
    }
    let mut f = follower(p.replay_endpoint());
    for (seq, b) in old.iter().enumerate() {
        f.on_live(live(seq as u64, b)).await;
    }
    // The same engine, seen again after a reconnection with a gap: replayed.
    let more = payload(3, 1.0);
    p.publish_payload(more.clone()).await.unwrap();
    let next = payload(4, 1.0);
    p.publish_payload(next.clone()).await.unwrap();
    f.reconnected = true;
    f.on_live(live(4, &next)).await;
    assert_eq!(f.stats.engine_restarts.get(), 0);
    assert_eq!(blocks(&f), 5);
    // A restarted engine that already published past the old sequence.
    p.restart().await;
    let new: Vec<Bytes> = (10..17u64).map(|h| payload(h, 2.0)).collect();
    for b in &new {
        p.publish_payload(b.clone()).await.unwrap();
    }
    f.reconnected = true;
    f.on_live(live(6, &new[6])).await;
    assert_eq!(f.stats.engine_restarts.get(), 1);
    assert_eq!(
        blocks(&f),
        7,
        "only the new engine's, 0..=6 from its replay"
    );
    assert_eq!(f.stats.gaps_unrecovered.get(), 0);
}
