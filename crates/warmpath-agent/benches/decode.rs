//! Decode throughput of vLLM KV-event payloads, in blocks per second.
#![allow(clippy::unwrap_used, missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use warmpath_vllm_events::{
    decode_batch, encode_batch, BlockStored, EngineBlockHash, KvEvent, KvEventBatch, Medium,
    PayloadForm,
};

/// A batch of `events` BlockStored events, each covering `blocks` blocks of 16 tokens.
fn batch(events: usize, blocks: usize) -> KvEventBatch {
    let mut next = 1u64;
    let events = (0..events)
        .map(|e| {
            let hashes: Vec<EngineBlockHash> = (0..blocks)
                .map(|_| {
                    next = next
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    EngineBlockHash::Int(next)
                })
                .collect();
            KvEvent::BlockStored(BlockStored {
                block_hashes: hashes,
                parent_block_hash: (e % 2 == 1).then_some(EngineBlockHash::Int(e as u64)),
                token_ids: (0..(blocks * 16) as u32).map(|t| t * 31 + 1000).collect(),
                block_size: 16,
                medium: Some(Medium::Gpu),
                group_idx: Some(0),
                ..Default::default()
            })
        })
        .collect();
    KvEventBatch {
        ts: 1.0,
        events,
        dp_rank: Some(0),
    }
}

fn bench_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_blocks");
    for (events, blocks) in [(1, 1), (16, 4), (64, 32)] {
        let b = batch(events, blocks);
        for form in [PayloadForm::Map, PayloadForm::Array] {
            let bytes = encode_batch(&b, form);
            g.throughput(Throughput::Elements((events * blocks) as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("{form:?}"), format!("{events}ev_x_{blocks}blk")),
                &bytes,
                |bench, bytes| bench.iter(|| decode_batch(bytes).unwrap()),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench_decode);
criterion_main!(benches);
