//! Cold placement at fleet scale.
//!
//! `cargo bench -p warmpath-core --bench placement`
//!
//! `kv_aware`'s pick for prefixes no backend holds, over 1000 backends of
//! known capacity (8192 blocks each) whose modelled caches were filled by
//! 40,000 earlier placements of 500-block chains, so the eviction and
//! turnover terms are live. Each iteration places a new prefix (a cold
//! decision, the one the scale model reports as `cold`), so the state
//! moves on as it does under traffic.

#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, Criterion};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use warmpath_core::policy::Mode;
use warmpath_core::{
    build_policy, BackendLoad, BlockHash, CacheIndex, Loads, PolicyBackend, PolicyConfig,
    RouteInput, Strategy,
};

const BACKENDS: usize = 1000;
const CAPACITY: u64 = 8192;
const CHAIN: u32 = 500;
const FILL: usize = 40_000;

fn bench_cold(c: &mut Criterion) {
    let backends: Vec<PolicyBackend> = (0..BACKENDS)
        .map(|i| PolicyBackend {
            id: format!("http://10.0.{}.{}:8000", i / 256, i % 256),
            slot: i as u16,
            capacity_blocks: Some(CAPACITY),
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(5);
    let loads: Vec<BackendLoad> = (0..BACKENDS)
        .map(|_| BackendLoad {
            eligible: true,
            in_flight: rng.random_range(0..4),
            pending_prefill_blocks: rng.random_range(0..1000),
            engine: None,
        })
        .collect();
    let idx = CacheIndex::new();
    for b in &backends {
        idx.register_worker(&b.id).unwrap();
    }
    let unheld: Vec<BlockHash> = (0..u64::from(CHAIN)).map(BlockHash).collect();
    let m = idx.longest_match(&unheld);
    let p = build_policy(Strategy::KvAware, &PolicyConfig::default(), &backends, None)
        .unwrap()
        .policy;
    let place = |rng: &mut SmallRng| {
        let input = RouteInput {
            prefix_key: rng.random(),
            chain_blocks: CHAIN,
            matches: Some(&m),
            mode: Mode::Commit,
        };
        black_box(p.pick(black_box(&input), &Loads::new(&loads), rng).unwrap())
    };
    for _ in 0..FILL {
        place(&mut rng);
    }
    let mut g = c.benchmark_group("cold_placement_1000_backends");
    g.bench_function("kv_aware", |b| b.iter(|| place(&mut rng)));
    g.finish();
}

criterion_group!(benches, bench_cold);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
