//! The heart of the engine: computing a prompt over cached prefix blocks gives
//! the same last-position logits and the same greedy continuation as a full
//! recompute, for many prefix lengths and block boundaries, after evictions and
//! across salts; and the events emitted describe the cache exactly.
//!
//! Tolerance: the cached path multiplies differently shaped matrices than a
//! full recompute (and chunks the prefill), so f32 rounding differs. We require
//! max |logit difference| <= 1e-4 * max(1, max |logit|).

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use warmpath_core::prefix_cache::{engine_block_hash, CacheEvent, EngineBlockHash};
use warmpath_engine::config::LlamaConfig;
use warmpath_engine::kv::KvState;
use warmpath_engine::model::Llama;
use warmpath_engine::weights::random_weights;
use warmpath_engine::{Engine, EngineOptions, EventSink, Finish};

const VOCAB: usize = 300;

fn model(seed: u64) -> Llama {
    let cfg = LlamaConfig::tiny(VOCAB);
    let w = random_weights(&cfg, seed, DType::F32, &Device::Cpu).unwrap();
    Llama::load(VarBuilder::from_tensors(w, DType::F32, &Device::Cpu), &cfg).unwrap()
}

#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<CacheEvent>>>);

impl EventSink for Collect {
    fn publish(&mut self, events: Vec<CacheEvent>) {
        self.0.lock().unwrap().extend(events);
    }
}

fn engine(block_size: usize, cache_blocks: usize, chunk: usize) -> (Engine, Collect) {
    let sink = Collect::default();
    let opts = EngineOptions {
        block_size,
        cache_blocks,
        prefill_chunk: chunk,
    };
    (
        Engine::new(model(1), opts, Box::new(sink.clone())).unwrap(),
        sink,
    )
}

/// Deterministic pseudo-random prompt tokens.
fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % VOCAB as u64) as u32
        })
        .collect()
}

fn full_logits(m: &Llama, t: &[u32]) -> Tensor {
    m.forward(t, &KvState::default()).unwrap().0
}

fn assert_close(a: &Tensor, b: &Tensor, what: &str) {
    let a = a.to_vec1::<f32>().unwrap();
    let b = b.to_vec1::<f32>().unwrap();
    let scale = a.iter().fold(1f32, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        diff <= 1e-4 * scale,
        "{what}: max diff {diff} (scale {scale})"
    );
}

#[test]
fn cached_prefix_logits_match_full_recompute() {
    let reference = model(1);
    for bs in [4usize, 16] {
        for prefix_len in [1usize, 15, 16, 17, 31, 32, 33, 63, 64, 100] {
            let (mut e, _) = engine(bs, 1024, 512);
            let prefix = tokens(prefix_len as u64, prefix_len);
            let a: Vec<u32> = prefix.iter().copied().chain(tokens(1000, 9)).collect();
            let b: Vec<u32> = prefix.iter().copied().chain(tokens(2000, 5)).collect();
            e.prefill(&a, None).unwrap();
            let p = e.prefill(&b, None).unwrap();
            assert_eq!(
                p.cached_tokens,
                prefix_len / bs * bs,
                "bs {bs} prefix {prefix_len}"
            );
            assert_close(
                &p.logits,
                &full_logits(&reference, &b),
                &format!("bs {bs} prefix {prefix_len}"),
            );
            // A full hit recomputes the last block and still agrees.
            let again = e.prefill(&b, None).unwrap();
            assert_eq!(again.cached_tokens, (b.len() - 1) / bs * bs);
            assert_close(&again.logits, &p.logits, "full hit");
        }
    }
}

#[test]
fn chunked_prefill_matches_one_pass() {
    let reference = model(1);
    let t = tokens(7, 77);
    for chunk in [1usize, 7, 16, 76] {
        let (mut e, _) = engine(16, 0, chunk);
        let p = e.prefill(&t, None).unwrap();
        assert_eq!(p.cached_tokens, 0);
        assert_close(
            &p.logits,
            &full_logits(&reference, &t),
            &format!("chunk {chunk}"),
        );
    }
}

#[test]
fn greedy_continuation_with_cache_equals_without() {
    let (mut cold, _) = engine(8, 0, 512);
    let (mut warm, _) = engine(8, 256, 512);
    let prefix = tokens(3, 50);
    for tail in 0..3u64 {
        let t: Vec<u32> = prefix
            .iter()
            .copied()
            .chain(tokens(100 + tail, 6))
            .collect();
        let g_cold = cold.generate(&t, None, 12, &[], |_| true).unwrap();
        let g_warm = warm.generate(&t, None, 12, &[], |_| true).unwrap();
        assert_eq!(g_cold.cached_tokens, 0);
        if tail > 0 {
            assert_eq!(g_warm.cached_tokens, 48);
        }
        assert_eq!(g_cold.tokens, g_warm.tokens, "tail {tail}");
        assert_eq!(g_warm.tokens.len(), 12);
        assert_eq!(g_warm.finish, Finish::Length);
    }
}

#[test]
fn generation_stops_at_stop_ids_and_when_the_consumer_leaves() {
    let (mut e, _) = engine(8, 64, 512);
    let t = tokens(5, 20);
    let free = e.generate(&t, None, 6, &[], |_| true).unwrap();
    let stop = e
        .generate(&t, None, 6, &[free.tokens[2]], |_| true)
        .unwrap();
    assert_eq!(stop.finish, Finish::Stop);
    assert_eq!(
        stop.tokens,
        free.tokens[..free
            .tokens
            .iter()
            .position(|&x| x == free.tokens[2])
            .unwrap()]
    );
    let mut seen = 0;
    let gone = e
        .generate(&t, None, 6, &[], |_| {
            seen += 1;
            seen < 2
        })
        .unwrap();
    assert_eq!((gone.finish, gone.tokens.len()), (Finish::Cancelled, 2));
}

#[test]
fn evictions_keep_results_exact() {
    let reference = model(1);
    // 6 blocks of 4 tokens: prompts of ~3-5 blocks keep evicting each other.
    let (mut e, sink) = engine(4, 6, 512);
    let prefixes = [tokens(11, 12), tokens(12, 16), tokens(13, 9)];
    let order = [0usize, 0, 1, 0, 2, 2, 0, 1, 1, 0, 2, 0];
    let mut hits = 0;
    for (round, &which) in order.iter().enumerate() {
        let round = round as u64;
        let p = &prefixes[which];
        let t: Vec<u32> = p.iter().copied().chain(tokens(500 + round, 3)).collect();
        let out = e.prefill(&t, None).unwrap();
        hits += out.cached_tokens;
        assert_close(
            &out.logits,
            &full_logits(&reference, &t),
            &format!("round {round}"),
        );
        assert!(e.cache().len() <= 6);
    }
    assert!(hits > 0, "some prefix was reused");
    let removed = sink
        .0
        .lock()
        .unwrap()
        .iter()
        .any(|ev| matches!(ev, CacheEvent::BlockRemoved { .. }));
    assert!(removed, "the cache evicted blocks");
}

#[test]
fn greedy_continuations_stay_exact_while_blocks_are_evicted() {
    // A cache of 5 blocks of 4 tokens against prompts of 4-6 blocks: most
    // requests evict blocks another one will need, some reuse a prefix.
    let (mut cold, _) = engine(4, 0, 512);
    let (mut warm, sink) = engine(4, 5, 512);
    let prefixes = [tokens(31, 13), tokens(32, 17), tokens(33, 8)];
    let mut hits = 0;
    for (round, which) in [0usize, 0, 1, 0, 2, 1, 1, 0, 2, 2].into_iter().enumerate() {
        let t: Vec<u32> = prefixes[which]
            .iter()
            .copied()
            .chain(tokens(700 + round as u64, 4))
            .collect();
        let want = cold.generate(&t, None, 8, &[], |_| true).unwrap();
        let got = warm.generate(&t, None, 8, &[], |_| true).unwrap();
        assert_eq!(got.tokens, want.tokens, "round {round}");
        hits += got.cached_tokens;
        assert!(warm.cache().len() <= 5);
    }
    assert!(hits > 0, "some prefix was reused");
    let evicted = sink
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|ev| matches!(ev, CacheEvent::BlockRemoved { .. }))
        .count();
    assert!(evicted >= 3, "blocks were evicted ({evicted} removals)");
}

#[test]
fn different_salts_never_share_blocks() {
    let (mut e, _) = engine(4, 256, 512);
    let t = tokens(9, 40);
    assert_eq!(e.prefill(&t, Some("tenant-a")).unwrap().cached_tokens, 0);
    assert_eq!(e.prefill(&t, Some("tenant-b")).unwrap().cached_tokens, 0);
    assert_eq!(e.prefill(&t, None).unwrap().cached_tokens, 0);
    assert_eq!(e.prefill(&t, Some("tenant-a")).unwrap().cached_tokens, 36);
    assert_eq!(e.cache().len(), 30);
    let (mut fresh, _) = engine(4, 256, 512);
    assert_close(
        &e.prefill(&t, Some("tenant-b")).unwrap().logits,
        &fresh.prefill(&t, None).unwrap().logits,
        "salt does not change results",
    );
}

#[test]
fn events_mirror_the_cache_contents() {
    let bs = 4;
    let (mut e, sink) = engine(bs, 10, 512);
    let a = tokens(21, 18);
    let b: Vec<u32> = a[..8].iter().copied().chain(tokens(22, 14)).collect();
    let c = tokens(23, 30);
    for (t, salt) in [
        (&a, None),
        (&b, Some("s")),
        (&b, None),
        (&c, None),
        (&a, None),
    ] {
        e.prefill(t, salt).unwrap();
    }
    e.reset_cache().unwrap();
    e.prefill(&a, Some("s")).unwrap();
    // Replay the events independently.
    let mut mirror: HashMap<EngineBlockHash, Vec<u32>> = HashMap::new();
    let mut saw = [false; 3];
    for ev in sink.0.lock().unwrap().iter() {
        match ev {
            CacheEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                cache_salt,
            } => {
                saw[0] = true;
                assert_eq!(*block_size, bs);
                let mut parent = *parent_block_hash;
                for (h, blk) in block_hashes.iter().zip(token_ids.chunks_exact(bs)) {
                    let salt = if parent.is_none() {
                        cache_salt.as_deref()
                    } else {
                        None
                    };
                    assert_eq!(*h, engine_block_hash(parent, blk, salt));
                    mirror.insert(*h, blk.to_vec());
                    parent = Some(*h);
                }
            }
            CacheEvent::BlockRemoved { block_hashes } => {
                saw[1] = true;
                for h in block_hashes {
                    assert!(mirror.remove(h).is_some());
                }
            }
            CacheEvent::AllBlocksCleared => {
                saw[2] = true;
                mirror.clear();
            }
        }
    }
    assert_eq!(saw, [true, true, true]);
    let mut got: Vec<_> = e.cache().hashes().collect();
    let mut want: Vec<_> = mirror.keys().copied().collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn bad_prompts_are_refused_without_panicking() {
    let (mut e, _) = engine(4, 16, 512);
    assert!(e.prefill(&[], None).unwrap_err().is_client_error());
    assert!(e
        .prefill(&[VOCAB as u32], None)
        .unwrap_err()
        .is_client_error());
    assert!(e
        .generate(&[1, 2], None, 1 << 20, &[], |_| true)
        .unwrap_err()
        .is_client_error());
}
