//! Publish-to-visible delay: a vLLM-compatible publisher sends one
//! BlockStored of 16 blocks every 1.6 ms (10k blocks/s) over ZMQ to the real
//! agent, which publishes over gRPC to the router's real ingest; a poller
//! thread watches the router's `CacheIndex` for each event's last block and
//! records the time from just before the ZMQ send to the block being
//! visible. Prints p50/p90/p99/max.
//!
//! `cargo bench -p warmpath-agent --bench visible [-- SECONDS [BLOCKS_PER_S]]`
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{publisher_and_agent, Ingest};
use warmpath_core::{hash_tokens, BlockHash, HashSeed};
use warmpath_vllm_events::{BlockStored, EngineBlockHash, KvEvent, Medium};

const BLOCK: usize = 16;
const BLOCKS_PER_EVENT: usize = 16;

fn main() {
    // `cargo bench` passes `--bench`; numbers are positional.
    let nums: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seconds = nums.first().copied().unwrap_or(10.0);
    let rate = nums.get(1).copied().unwrap_or(10_000.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(seconds, rate));
}

/// Event `i`: a fresh chain of 16 blocks with tokens unique to `i`, and the
/// router-side hash of its last block.
fn event(i: u64) -> (KvEvent, BlockHash) {
    let toks: Vec<u32> = (0..(BLOCK * BLOCKS_PER_EVENT) as u32)
        .map(|t| t + (i as u32) * 4096 + 1)
        .collect();
    let last = *hash_tokens(HashSeed::new("m", "", ""), BLOCK, &toks)
        .last()
        .unwrap();
    let ev = KvEvent::BlockStored(BlockStored {
        block_hashes: (0..BLOCKS_PER_EVENT as u64)
            .map(|k| EngineBlockHash::Int(i * 1000 + k + 1))
            .collect(),
        token_ids: toks,
        block_size: BLOCK as u32,
        medium: Some(Medium::Gpu),
        ..Default::default()
    });
    (ev, last)
}

fn pct(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

async fn run(seconds: f64, rate: f64) {
    let router = Ingest::start(BLOCK).await;
    let (p, agent) = publisher_and_agent(&router).await;
    let n = ((seconds * rate) / BLOCKS_PER_EVENT as f64).ceil() as u64;
    // Built before the clock starts: the hashing here is the checker's, not
    // the pipeline's.
    let events: Vec<(KvEvent, BlockHash)> = (0..=n).map(event).collect();
    let mut events = events.into_iter();
    // Warm-up event: the agent learns the block size (Hello + snapshot).
    let (ev, h) = events.next().unwrap();
    p.publish(vec![ev]).await.unwrap();
    while router.index.holders_of(h).is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
        p.publish(vec![]).await.unwrap();
    }

    let pending: Arc<Mutex<VecDeque<(BlockHash, Instant)>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (pending, done, index) = (pending.clone(), done.clone(), router.index.clone());
        std::thread::spawn(move || {
            let mut lat = Vec::new();
            loop {
                let front = pending.lock().front().copied();
                match front {
                    Some((h, t0)) if !index.holders_of(h).is_empty() => {
                        lat.push(t0.elapsed());
                        pending.lock().pop_front();
                    }
                    Some(_) => std::thread::sleep(Duration::from_micros(50)),
                    None if done.load(Ordering::Acquire) => return lat,
                    None => std::thread::sleep(Duration::from_micros(50)),
                }
            }
        })
    };
    let period = Duration::from_secs_f64(BLOCKS_PER_EVENT as f64 / rate);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let start = Instant::now();
    for (ev, h) in events {
        tick.tick().await;
        pending.lock().push_back((h, Instant::now()));
        p.publish(vec![ev]).await.unwrap();
    }
    let sent_for = start.elapsed();
    // A batch lost at the very end shows as a gap only when the next comes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pending.lock().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        p.publish(vec![]).await.unwrap();
    }
    let unseen = pending.lock().len();
    pending.lock().clear();
    done.store(true, Ordering::Release);
    let mut lat = poller.join().unwrap();
    lat.sort();
    if lat.is_empty() {
        println!("visible: nothing became visible ({unseen} events never seen)");
        return;
    }
    let blocks = n * BLOCKS_PER_EVENT as u64;
    println!(
        "visible: {n} events x {BLOCKS_PER_EVENT} blocks at {:.0} blocks/s (target {rate:.0}) for {:.1}s; publish -> in router index (ms): p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}; {} measured, {unseen} never seen; agent gaps {} (replayed {})",
        blocks as f64 / sent_for.as_secs_f64(),
        sent_for.as_secs_f64(),
        pct(&lat, 0.5),
        pct(&lat, 0.9),
        pct(&lat, 0.99),
        lat.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        lat.len(),
        agent.stats().gaps.get(),
        agent.stats().replays_ok.get(),
    );
    agent.shutdown().await;
    router.stop().await;
}
