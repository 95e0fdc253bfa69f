//! The chunked walk against the block-by-block walk it replaced: on random
//! index states (holes, tiers, removals, cleared and dropped workers, stale
//! ones) and chains that share prefixes, `longest_match` returns exactly what
//! one `DashMap::get` per block did.

#![allow(clippy::unwrap_used)]

use super::*;
use proptest::prelude::*;
use std::sync::atomic::Ordering;
use warmpath_hash::BlockHash;
use warmpath_hash::{hash_tokens, HashSeed};

/// The reference: the walk as written before (one lookup per block).
fn reference(idx: &CacheIndex, hashes: &[BlockHash]) -> MatchResult {
    struct Active {
        slot: WorkerSlot,
        gen: u8,
        fresh: bool,
        gpu_blocks: u32,
        gpu_contiguous: bool,
    }
    let mut out = MatchResult {
        workers: Vec::new(),
        chain_len: hashes.len() as u32,
    };
    let Some(first) = hashes.first() else {
        return out;
    };
    let view = idx.workers.routing_view();
    let mut active: Vec<Active> = match idx.map.get(&first.0) {
        None => return out,
        Some(e) => e
            .iter()
            .filter_map(|h| {
                let (gen, fresh) = (*view.get(h.slot() as usize)?)?;
                (gen == h.gen()).then(|| {
                    let gpu = h.tiers() & Tier::Gpu.bit() != 0;
                    Active {
                        slot: h.slot(),
                        gen,
                        fresh,
                        gpu_blocks: u32::from(gpu),
                        gpu_contiguous: gpu,
                    }
                })
            })
            .collect(),
    };
    let finish = |a: &Active, depth: u32, out: &mut MatchResult| {
        out.workers.push(WorkerMatch {
            slot: a.slot,
            blocks: depth,
            gpu_blocks: a.gpu_blocks,
            fresh: a.fresh,
        });
    };
    for (i, h) in hashes.iter().enumerate().skip(1) {
        if active.is_empty() {
            break;
        }
        let depth = i as u32;
        match idx.map.get(&h.0) {
            None => {
                for a in &active {
                    finish(a, depth, &mut out);
                }
                active.clear();
            }
            Some(e) => active.retain_mut(|a| match e.find(a.slot) {
                Some(x) if x.gen() == a.gen => {
                    if a.gpu_contiguous && x.tiers() & Tier::Gpu.bit() != 0 {
                        a.gpu_blocks += 1;
                    } else {
                        a.gpu_contiguous = false;
                    }
                    true
                }
                _ => {
                    finish(a, depth, &mut out);
                    false
                }
            }),
        }
    }
    for a in &active {
        finish(a, hashes.len() as u32, &mut out);
    }
    out.workers.sort_unstable_by_key(|m| m.slot);
    out
}

/// Chain `k` of `n` blocks: chain 0 is the trunk, chain `k > 0` shares the
/// trunk's first `k * 13` blocks and then goes its own way.
fn chain(k: u32, n: u32) -> Vec<BlockHash> {
    let shared = (k * 13).min(n);
    let toks: Vec<u32> = (0..n * 2)
        .map(|t| if t < shared * 2 { t } else { t + 1_000_000 * k })
        .collect();
    hash_tokens(HashSeed::new("m", "", ""), 2, &toks)
}

#[derive(Debug, Clone)]
enum Op {
    /// worker, tier, chain, from, len
    Store(u8, u8, u8, u16, u16),
    /// worker, tier (`None`: all), chain, from, len
    Remove(u8, Option<u8>, u8, u16, u16),
    Clear(u8),
    Drop(u8),
    Heard(u8, u8),
    Refresh(u8),
}

const WORKERS: u8 = 7;
const CHAINS: u8 = 4;
const LEN: u32 = 150;

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    let span = prop_oneof![
        // Mostly prefix-closed holdings, as engines keep them; some anywhere.
        3 => (Just(0u16), 1u16..LEN as u16),
        2 => (0u16..LEN as u16, 1u16..80),
    ];
    prop_oneof![
        8 => (w.clone(), 0u8..3, 0..CHAINS, span.clone())
            .prop_map(|(w, t, c, (f, l))| Op::Store(w, t, c, f, l)),
        3 => (w.clone(), proptest::option::of(0u8..3), 0..CHAINS, span)
            .prop_map(|(w, t, c, (f, l))| Op::Remove(w, t, c, f, l)),
        1 => w.clone().prop_map(Op::Clear),
        1 => w.clone().prop_map(Op::Drop),
        1 => (w, 0u8..20).prop_map(|(w, t)| Op::Heard(w, t)),
        1 => (0u8..40).prop_map(Op::Refresh),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every chain, and every cut of one, matches as the reference walk says.
    #[test]
    fn the_chunked_walk_is_the_block_by_block_walk(
        ops in proptest::collection::vec(op(), 1..40),
        cuts in proptest::collection::vec((0..CHAINS, 0u32..=LEN), 1..6),
    ) {
        let idx = CacheIndex::new();
        let chains: Vec<Vec<BlockHash>> = (0..CHAINS as u32).map(|k| chain(k, LEN)).collect();
        let ids: Vec<String> = (0..WORKERS).map(|w| format!("w{w}")).collect();
        for id in &ids {
            idx.register_worker(id).unwrap();
        }
        let slot = |w: u8| idx.worker_slot(&ids[w as usize]);
        let span = |c: u8, f: u16, l: u16| {
            let ch = &chains[c as usize];
            let from = (f as usize).min(ch.len());
            &ch[from..(from + l as usize).min(ch.len())]
        };
        for op in ops {
            // Errors (a dropped worker) are part of the history, not a failure.
            match op {
                Op::Store(w, t, c, f, l) => {
                    if let Some(s) = slot(w) {
                        let _ = idx.store(s, Tier::ALL[t as usize], span(c, f, l));
                    }
                }
                Op::Remove(w, t, c, f, l) => {
                    if let Some(s) = slot(w) {
                        let _ = idx.remove(s, t.map(|t| Tier::ALL[t as usize]), span(c, f, l));
                    }
                }
                Op::Clear(w) => {
                    if let Some(s) = slot(w) {
                        idx.clear_worker(s).unwrap();
                    }
                }
                Op::Drop(w) => {
                    idx.drop_worker(&ids[w as usize]);
                }
                Op::Heard(w, t) => {
                    if let Some(s) = slot(w) {
                        idx.mark_heard(s, u64::from(t)).unwrap();
                    }
                }
                Op::Refresh(t) => {
                    idx.refresh_staleness(u64::from(t), 10, u64::MAX);
                }
            }
        }
        for ch in &chains {
            prop_assert_eq!(idx.longest_match(ch), reference(&idx, ch));
        }
        for (c, n) in cuts {
            let ch = &chains[c as usize][..n as usize];
            prop_assert_eq!(idx.longest_match(ch), reference(&idx, ch));
        }
    }
}

/// A chain past the third chunk (512 blocks), with matches ending in each
/// chunk and one worker holding all of it.
#[test]
fn long_chains_match_in_every_chunk() {
    let idx = CacheIndex::new();
    let ch = chain(0, 700);
    let ends = [0usize, 1, 7, 8, 9, 63, 64, 65, 300, 511, 512, 513, 699, 700];
    let slots: Vec<WorkerSlot> = ends
        .iter()
        .map(|e| {
            let s = idx.register_worker(&format!("e{e}")).unwrap();
            idx.store(s, Tier::Gpu, &ch[..*e]).unwrap();
            // Held again past a hole: must not count.
            idx.store(s, Tier::Cpu, &ch[(*e + 1).min(700)..]).unwrap();
            s
        })
        .collect();
    let m = idx.longest_match(&ch);
    assert_eq!(m, reference(&idx, &ch));
    for (s, e) in slots.iter().zip(ends) {
        assert_eq!(m.of(*s).map_or(0, |x| x.blocks), e as u32, "ends at {e}");
    }
}

/// A hot prefix's copies: many workers with the same holdings, so most
/// blocks have the same spilled holders as the block before, broken where
/// one worker's match or GPU run ends or a worker joins further down.
#[test]
fn many_copies_with_equal_holders_match_as_the_reference() {
    let idx = CacheIndex::new();
    let ch = chain(0, 600);
    let copies: Vec<WorkerSlot> = (0..12)
        .map(|w| {
            let s = idx.register_worker(&format!("copy{w}")).unwrap();
            idx.store(s, Tier::Gpu, &ch).unwrap();
            s
        })
        .collect();
    // One loses a block mid-chain; one holds the tail on CPU only; one
    // holds one block on CPU alone (its tiers differ there, then agree:
    // its GPU run ends there, though it matches on).
    idx.remove(copies[0], None, &ch[300..301]).unwrap();
    idx.remove(copies[1], Some(Tier::Gpu), &ch[100..]).unwrap();
    idx.store(copies[1], Tier::Cpu, &ch[100..]).unwrap();
    idx.store(copies[2], Tier::Cpu, &ch[200..201]).unwrap();
    idx.remove(copies[2], Some(Tier::Gpu), &ch[200..201])
        .unwrap();
    // A worker holding only the second half never matches.
    let late = idx.register_worker("late").unwrap();
    idx.store(late, Tier::Gpu, &ch[300..]).unwrap();
    let m = idx.longest_match(&ch);
    assert_eq!(m, reference(&idx, &ch));
    let of = |s: WorkerSlot| m.of(s).map(|x| (x.blocks, x.gpu_blocks));
    assert_eq!(of(copies[0]), Some((300, 300)));
    assert_eq!(of(copies[1]), Some((600, 100)));
    assert_eq!(of(copies[2]), Some((600, 200)));
    assert_eq!(of(copies[11]), Some((600, 600)));
    assert_eq!(of(late), None);
    for cut in [1usize, 8, 64, 100, 101, 299, 300, 301, 512, 599] {
        assert_eq!(idx.longest_match(&ch[..cut]), reference(&idx, &ch[..cut]));
    }
}

/// Whether `slot` really is prefix-closed over `chains`: every block it
/// holds is GPU-only and the block before it is held.
fn truly_closed(idx: &CacheIndex, slot: WorkerSlot, chains: &[Vec<BlockHash>]) -> bool {
    let gen = idx.workers.get(slot).unwrap().gen.load(Ordering::Acquire);
    let tiers = |h: &BlockHash| {
        idx.map
            .get(&h.0)
            .and_then(|e| e.find(slot))
            .filter(|x| x.gen() == gen)
            .map_or(0, |x| x.tiers())
    };
    chains.iter().all(|ch| {
        ch.iter().enumerate().all(|(i, h)| {
            let t = tiers(h);
            t == 0 || (t == Tier::Gpu.bit() && (i == 0 || tiers(&ch[i - 1]) != 0))
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Workers holding unions of chain prefixes (as engines do), some of
    /// them with holes or CPU blocks, each claimed closed exactly when it
    /// is: the skipping walk returns what the block-by-block walk does.
    #[test]
    fn the_skipping_walk_is_the_block_by_block_walk(
        prefixes in proptest::collection::vec((0..WORKERS, 0..CHAINS, 0u32..=LEN), 1..30),
        holes in proptest::collection::vec((0..WORKERS, 0..CHAINS, 1u32..LEN, proptest::bool::ANY), 0..4),
        cuts in proptest::collection::vec((0..CHAINS, 0u32..=LEN), 1..6),
    ) {
        let idx = CacheIndex::new();
        let chains: Vec<Vec<BlockHash>> = (0..CHAINS as u32).map(|k| chain(k, LEN)).collect();
        let slots: Vec<WorkerSlot> = (0..WORKERS)
            .map(|w| idx.register_worker(&format!("w{w}")).unwrap())
            .collect();
        // Each worker's held prefix per chain; the index holds their union.
        let mut held = vec![[0u32; CHAINS as usize]; WORKERS as usize];
        for (w, c, n) in prefixes {
            let s = slots[w as usize];
            let want = &mut held[w as usize];
            want[c as usize] = n;
            let union: std::collections::HashSet<u64> = (0..CHAINS as usize)
                .flat_map(|k| chains[k][..want[k] as usize].iter().map(|h| h.0))
                .collect();
            let gone: Vec<BlockHash> = chains
                .iter()
                .flatten()
                .filter(|h| !union.contains(&h.0))
                .copied()
                .collect();
            idx.remove(s, None, &gone).unwrap();
            for k in 0..CHAINS as usize {
                idx.store(s, Tier::Gpu, &chains[k][..want[k] as usize]).unwrap();
            }
        }
        for (w, c, at, cpu) in holes {
            let s = slots[w as usize];
            let h = &chains[c as usize][at as usize..at as usize + 1];
            idx.remove(s, None, h).unwrap();
            if cpu {
                idx.store(s, Tier::Cpu, h).unwrap();
            }
        }
        for &s in &slots {
            idx.set_prefix_closed(s, truly_closed(&idx, s, &chains)).unwrap();
        }
        for ch in &chains {
            prop_assert_eq!(idx.longest_match(ch), reference(&idx, ch));
        }
        for (c, n) in cuts {
            let ch = &chains[c as usize][..n as usize];
            prop_assert_eq!(idx.longest_match(ch), reference(&idx, ch));
        }
    }
}

/// A 512-block match skips: the walk probes far fewer blocks, and still
/// finds each match's end inside a batch.
#[test]
fn closed_workers_match_exactly_where_their_runs_end() {
    let idx = CacheIndex::new();
    let ch = chain(0, 700);
    let ends = [0usize, 1, 7, 8, 9, 63, 64, 65, 300, 511, 512, 513, 699, 700];
    let slots: Vec<WorkerSlot> = ends
        .iter()
        .map(|e| {
            let s = idx.register_worker(&format!("e{e}")).unwrap();
            idx.store(s, Tier::Gpu, &ch[..*e]).unwrap();
            idx.set_prefix_closed(s, true).unwrap();
            s
        })
        .collect();
    let m = idx.longest_match(&ch);
    assert_eq!(m, reference(&idx, &ch));
    for (s, e) in slots.iter().zip(ends) {
        let x = m.of(*s).map_or((0, 0), |x| (x.blocks, x.gpu_blocks));
        assert_eq!(x, (e as u32, e as u32), "ends at {e}");
    }
}

/// A worker that stops being closed while a walk that skipped for it is
/// under way: the walk is redone, so it never counts the block now missing.
#[test]
fn a_change_during_a_skipping_walk_makes_it_walk_again() {
    let ch = chain(0, 512);
    for withdraw in [true, false] {
        let idx = CacheIndex::new();
        let s = idx.register_worker("w").unwrap();
        idx.store(s, Tier::Gpu, &ch).unwrap();
        idx.set_prefix_closed(s, true).unwrap();
        let hole = ch[100];
        idx.after_next_walk(move |idx| {
            if withdraw {
                // An agent's delta that breaks closure: the claim goes first.
                idx.set_prefix_closed(s, false).unwrap();
            }
            // A removal alone bumps the version too.
            idx.remove(s, None, &[hole]).unwrap();
        });
        let m = idx.longest_match(&ch);
        assert_eq!(m.of(s).map(|x| x.blocks), Some(100), "withdraw: {withdraw}");
        assert_eq!(m, reference(&idx, &ch));
    }
}
