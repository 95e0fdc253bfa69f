//! End-to-end throughput: vLLM-compatible publisher -> ZMQ -> agent (decode,
//! re-hash, hub) -> gRPC -> the router's real ingest -> its `CacheIndex`, on
//! 127.0.0.1. Prints blocks/s (counted in the index).
//!
//! `cargo bench -p warmpath-agent --bench pipeline`
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::{Duration, Instant};
use support::{publisher_and_agent, Ingest};
use warmpath_vllm_events::{BlockStored, EngineBlockHash, KvEvent, Medium};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let router = Ingest::start(16).await;
    let (p, agent) = publisher_and_agent(&router).await;
    let (batches, events_per_batch, blocks_per_event) = (2_000u64, 8u64, 16u64);
    let total = batches * events_per_batch * blocks_per_event;
    let mut h = 1u64;
    let start = Instant::now();
    for b in 0..batches {
        let events = (0..events_per_batch)
            .map(|e| {
                let hashes: Vec<EngineBlockHash> = (0..blocks_per_event)
                    .map(|_| {
                        h += 1;
                        EngineBlockHash::Int(h)
                    })
                    .collect();
                let salt = (b * events_per_batch + e) as u32;
                KvEvent::BlockStored(BlockStored {
                    block_hashes: hashes,
                    token_ids: (0..(blocks_per_event * 16) as u32)
                        .map(|t| t ^ (salt << 8))
                        .collect(),
                    block_size: 16,
                    medium: Some(Medium::Gpu),
                    ..Default::default()
                })
            })
            .collect();
        p.publish(events).await.unwrap();
        if b % 64 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let published = start.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    // Batches dropped at the very end are only noticed (as a gap) when the next
    // one arrives, as with vLLM: keep a trickle of empty batches going.
    let mut polls = 0u32;
    while router.blocks("w") < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
        polls += 1;
        if polls.is_multiple_of(20) {
            p.publish(vec![]).await.unwrap();
        }
    }
    let done = start.elapsed();
    let at_router = router.blocks("w");
    println!(
        "pipeline: {total} blocks ({batches} batches x {events_per_batch} events x {blocks_per_event} blocks) published in {:.3}s; {at_router} at the router after {:.3}s => {:.0} blocks/s end to end; gaps {} (replayed {}), unrecovered {}",
        published.as_secs_f64(),
        done.as_secs_f64(),
        at_router as f64 / done.as_secs_f64(),
        agent.stats().gaps.get(),
        agent.stats().replays_ok.get(),
        agent.stats().gaps_unrecovered.get(),
    );
    agent.shutdown().await;
    router.stop().await;
}
