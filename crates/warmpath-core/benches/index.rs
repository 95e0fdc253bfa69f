//! Cache index and policy benchmarks.
//!
//! `cargo bench -p warmpath-core --bench index`
//!
//! - `longest_match`: a 512-block chain over 64 workers with ~10M
//!   (block, worker) entries indexed; full hit, partial hit and cold chain.
//!   The first `OFFLOADING` workers also hold blocks on the CPU tier, so
//!   their walks probe every block; the others are prefix-closed and their
//!   walks skip (the index's `closure` docs). Each hit is measured both
//!   ways.
//!   Besides criterion's estimate, a per-call latency distribution
//!   (p50/p90/p99/p99.9/max over 200k calls) is printed, since the goal is
//!   stated as a p99.
//! - `ingest`: storing 512-block chains (the agent's stored events), blocks/s.
//! - memory: bytes per (block, worker) entry, measured with a counting
//!   global allocator.
//! - `pick`: each policy's pick over 64 backends.

// Measuring memory needs a counting global allocator.
#![allow(unsafe_code)]
#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;
use warmpath_core::policy::Mode;
use warmpath_core::{
    build_policy, hash_tokens, BackendLoad, BlockHash, CacheIndex, HashSeed, Loads, PolicyBackend,
    PolicyConfig, RouteInput, Strategy, Tier,
};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

const WORKERS: usize = 64;
const CHAIN: usize = 512;
const BS: usize = 16;

fn chain(id: u64) -> Vec<BlockHash> {
    let toks: Vec<u32> = (0..(CHAIN * BS) as u32)
        .map(|i| i.wrapping_mul(2654435761) ^ id as u32)
        .collect();
    hash_tokens(HashSeed::new("bench", "", &id.to_string()), BS, &toks)
}

/// Workers `0..OFFLOADING` hold CPU copies too: not prefix-closed.
const OFFLOADING: usize = 8;

/// ~10M entries: 19_000 chains of 512 blocks, each on one worker, 10% of
/// them also on a second worker and, on the CPU tier, an offloading one.
/// Returns the first chains: (chain, whether every holder is closed).
fn build_big() -> (CacheIndex, Vec<(Vec<BlockHash>, bool)>, f64) {
    let before = LIVE.load(Ordering::Relaxed);
    let idx = CacheIndex::new();
    let slots: Vec<_> = (0..WORKERS)
        .map(|w| idx.register_worker(&format!("w{w}")).unwrap())
        .collect();
    let mut rng = SmallRng::seed_from_u64(1);
    let mut kept = Vec::new();
    let n_chains = 19_000u64;
    for c in 0..n_chains {
        let ch = chain(c);
        let w = rng.random_range(0..WORKERS);
        idx.store(slots[w], Tier::Gpu, &ch).unwrap();
        let mut closed = w >= OFFLOADING;
        if c % 10 == 0 {
            let copy = (w + 1) % WORKERS;
            idx.store(slots[copy], Tier::Gpu, &ch).unwrap();
            idx.store(slots[(w + 2) % OFFLOADING], Tier::Cpu, &ch[..256])
                .unwrap();
            closed = false;
        }
        if c < 64 {
            kept.push((ch, closed));
        }
    }
    for (w, s) in slots.iter().enumerate() {
        idx.set_prefix_closed(*s, w >= OFFLOADING).unwrap();
    }
    let bytes = (LIVE.load(Ordering::Relaxed) - before) as f64;
    let per_entry = bytes / idx.entries() as f64;
    eprintln!(
        "index: {} entries, {} distinct blocks, {:.0} MiB live => {:.1} B per (block, worker) entry, {:.1} B per distinct block",
        idx.entries(),
        idx.distinct_blocks(),
        bytes / 1048576.0,
        per_entry,
        bytes / idx.distinct_blocks() as f64
    );
    (idx, kept, per_entry)
}

fn percentiles(name: &str, f: &mut dyn FnMut()) {
    let n = 200_000;
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        f();
        t.push(s.elapsed().as_nanos() as u64);
    }
    t.sort_unstable();
    let p = |q: f64| t[((n as f64 * q) as usize).min(n - 1)] as f64 / 1000.0;
    eprintln!(
        "{name}: p50 {:.2} us, p90 {:.2} us, p99 {:.2} us, p99.9 {:.2} us, max {:.2} us ({n} calls)",
        p(0.5),
        p(0.9),
        p(0.99),
        p(0.999),
        t[n - 1] as f64 / 1000.0
    );
}

fn bench_match(c: &mut Criterion) {
    let (idx, kept, _) = build_big();
    let pick = |closed: bool, skip: usize| {
        let mut of = kept.iter().filter(|(_, c)| *c == closed).skip(skip);
        of.next().map(|(ch, _)| ch.clone()).unwrap()
    };
    let partial_of = |ch: Vec<BlockHash>| {
        let mut p = ch[..200].to_vec();
        p.extend(chain(1_000_000)[200..].iter().copied());
        p
    };
    let full = pick(false, 0);
    let partial = partial_of(pick(false, 1));
    let full_closed = pick(true, 0);
    let partial_closed = partial_of(pick(true, 1));
    let cold = chain(2_000_000);
    // Distributions first (they are the goal's terms).
    percentiles("longest_match full 512/512", &mut || {
        black_box(idx.longest_match(black_box(&full)));
    });
    percentiles("longest_match partial 200/512", &mut || {
        black_box(idx.longest_match(black_box(&partial)));
    });
    percentiles(
        "longest_match full 512/512, prefix-closed holders",
        &mut || {
            black_box(idx.longest_match(black_box(&full_closed)));
        },
    );
    percentiles(
        "longest_match partial 200/512, prefix-closed holders",
        &mut || {
            black_box(idx.longest_match(black_box(&partial_closed)));
        },
    );
    percentiles("longest_match cold 0/512", &mut || {
        black_box(idx.longest_match(black_box(&cold)));
    });
    let mut g = c.benchmark_group("longest_match_10M_entries_64_workers");
    for (name, ch) in [
        ("full_512", &full),
        ("partial_200", &partial),
        ("full_512_closed", &full_closed),
        ("partial_200_closed", &partial_closed),
        ("cold", &cold),
    ] {
        g.bench_with_input(BenchmarkId::from_parameter(name), ch, |b, ch| {
            b.iter(|| black_box(idx.longest_match(black_box(ch))))
        });
    }
    g.finish();
}

fn bench_ingest(c: &mut Criterion) {
    let chains: Vec<Vec<BlockHash>> = (0..64).map(|i| chain(5_000_000 + i)).collect();
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements((chains.len() * CHAIN) as u64));
    g.bench_function("store_64_chains_of_512_blocks", |b| {
        b.iter_batched(
            || {
                let idx = CacheIndex::with_capacity(chains.len() * CHAIN);
                let s = idx.register_worker("w").unwrap();
                (idx, s)
            },
            |(idx, s)| {
                for ch in &chains {
                    idx.store(s, Tier::Gpu, ch).unwrap();
                }
                idx
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn bench_pick(c: &mut Criterion) {
    let backends: Vec<PolicyBackend> = (0..WORKERS)
        .map(|i| PolicyBackend {
            id: format!("http://10.0.0.{i}:8000"),
            slot: i as u16,
            capacity_blocks: None,
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(3);
    let loads: Vec<BackendLoad> = (0..WORKERS)
        .map(|_| BackendLoad {
            eligible: true,
            in_flight: rng.random_range(0..8),
            pending_prefill_blocks: rng.random_range(0..2000),
            engine: None,
        })
        .collect();
    let idx = CacheIndex::new();
    for b in &backends {
        idx.register_worker(&b.id).unwrap();
    }
    let ch = chain(9);
    idx.store(3, Tier::Gpu, &ch[..300]).unwrap();
    idx.store(7, Tier::Gpu, &ch[..100]).unwrap();
    let m = idx.longest_match(&ch);
    let mut g = c.benchmark_group("pick_64_backends");
    for s in Strategy::ALL {
        let p = build_policy(s, &PolicyConfig::default(), &backends, None)
            .unwrap()
            .policy;
        let input = RouteInput {
            prefix_key: 0x1234_5678,
            chain_blocks: CHAIN as u32,
            matches: Some(&m),
            mode: Mode::Commit,
        };
        g.bench_function(s.as_str(), |b| {
            b.iter(|| {
                black_box(
                    p.pick(black_box(&input), &Loads::new(&loads), &mut rng)
                        .unwrap(),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_match, bench_ingest, bench_pick);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
