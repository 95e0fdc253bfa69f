//! End-to-end throughput: vLLM-compatible publisher -> ZMQ -> agent (decode,
//! re-hash, hub) -> gRPC -> a recording router, on 127.0.0.1. Prints blocks/s.
//!
//! `cargo bench -p warmpath-agent --bench pipeline`
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};
use warmpath_agent::vllm::{
    BlockStored, EngineBlockHash, KvEvent, KvEventPublisher, Medium, PublisherConfig,
};
use warmpath_agent::{Agent, AgentConfig};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let router = common::TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let mut pc = PublisherConfig::new("tcp://127.0.0.1:0");
    pc.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    let p = KvEventPublisher::bind(pc).await.unwrap();
    let mut c = AgentConfig::new("w", "m", "http://127.0.0.1:9", p.endpoint());
    c.kv_replay = p.replay_endpoint().map(str::to_owned);
    c.routers = vec![router.url()];
    c.load_interval = Duration::ZERO;
    let agent = Agent::start(c, None).await.unwrap();
    // Warm up until the subscriber hears us.
    while agent.stats().batches.get() == 0 {
        p.publish(vec![]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    while (router.view().blocks.len() as u64) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
        polls += 1;
        if polls % 20 == 0 {
            p.publish(vec![]).await.unwrap();
        }
    }
    let done = start.elapsed();
    let at_router = router.view().blocks.len() as u64;
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
