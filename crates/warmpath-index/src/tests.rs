#![allow(clippy::unwrap_used)]
use super::*;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use warmpath_hash::BlockHash;
use warmpath_hash::{hash_tokens, HashSeed};

fn chain(n: u32, salt: &str) -> Vec<BlockHash> {
    let toks: Vec<u32> = (0..n * 4).collect();
    hash_tokens(HashSeed::new("m", "", salt), 4, &toks)
}

#[test]
fn longest_match_per_worker() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    let b = idx.register_worker("b").unwrap();
    let c = chain(10, "");
    idx.store(a, Tier::Gpu, &c[..7]).unwrap();
    idx.store(b, Tier::Gpu, &c[..3]).unwrap();
    idx.store(b, Tier::Cpu, &c[3..5]).unwrap();
    let m = idx.longest_match(&c);
    assert_eq!(m.chain_len, 10);
    assert_eq!(m.of(a).unwrap().blocks, 7);
    assert_eq!(m.of(a).unwrap().gpu_blocks, 7);
    assert_eq!(m.of(b).unwrap().blocks, 5);
    assert_eq!(m.of(b).unwrap().gpu_blocks, 3);
    assert!(m.workers.iter().all(|w| w.fresh));
}

#[test]
fn a_hole_ends_the_match() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    let c = chain(6, "");
    idx.store(a, Tier::Gpu, &c).unwrap();
    idx.remove(a, None, &c[2..3]).unwrap();
    assert_eq!(idx.longest_match(&c).of(a).unwrap().blocks, 2);
    assert_eq!(idx.block_count(a), 5);
}

#[test]
fn clear_is_immediate_and_compaction_purges() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    let b = idx.register_worker("b").unwrap();
    let c = chain(8, "");
    idx.store(a, Tier::Gpu, &c).unwrap();
    idx.store(b, Tier::Gpu, &c[..2]).unwrap();
    idx.clear_worker(a).unwrap();
    let m = idx.longest_match(&c);
    assert!(m.of(a).is_none());
    assert_eq!(m.of(b).unwrap().blocks, 2);
    assert_eq!(idx.block_count(a), 0);
    assert_eq!(idx.compact(), 6, "blocks only a held are gone");
    assert_eq!(idx.distinct_blocks(), 2);
    // a stores again after the clear: counts restart from zero
    assert_eq!(idx.store(a, Tier::Gpu, &c[..3]).unwrap(), 3);
    assert_eq!(idx.block_count(a), 3);
}

#[test]
fn drop_worker_removes_everything_and_frees_the_slot_after_a_compaction() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    let c = chain(4, "");
    idx.store(a, Tier::Gpu, &c).unwrap();
    assert!(idx.drop_worker("a"));
    assert!(!idx.drop_worker("a"), "once");
    assert_eq!(idx.entries(), 0, "its entries stop counting at once");
    assert!(idx.longest_match(&c).workers.is_empty());
    assert_eq!(
        idx.store(a, Tier::Gpu, &c),
        Err(IndexError::UnknownWorker(a)),
        "a late write for it lands nowhere"
    );
    // Its holders are still in the map: the slot waits for a compaction.
    assert_eq!(idx.awaiting_compaction(), 1);
    let b = idx.register_worker("b").unwrap();
    assert_ne!(a, b, "not reused while its holders may be in the map");
    assert_eq!(idx.compact_dead(), 4);
    assert_eq!(idx.distinct_blocks(), 0);
    assert_eq!(
        (idx.awaiting_compaction(), idx.workers.reusable().1),
        (0, 1)
    );
    // Now the next worker takes it, and inherits none of a's claims.
    let a2 = idx.register_worker("a2").unwrap();
    assert_eq!(a2, a);
    assert_eq!(idx.block_count(a2), 0);
    assert!(idx.longest_match(&c).of(a2).is_none());
    assert_eq!(idx.worker_id(a2).as_deref(), Some("a2"));
}

#[test]
fn a_reused_slot_never_counts_a_holder_its_old_worker_left() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    let keep = idx.register_worker("keep").unwrap();
    let c = chain(6, "");
    idx.store(a, Tier::Gpu, &c).unwrap();
    idx.store(keep, Tier::Gpu, &c[..2]).unwrap();
    let old_gen = idx.entry(a).unwrap().gen.load(Ordering::Acquire);
    idx.drop_worker("a");
    // A compaction that started before the drop (it read no retired slot)
    // must not free it: only a pass that read it as tombstoned does.
    idx.workers.release(&[]);
    assert_eq!(idx.workers.reusable().1, 0);
    idx.compact();
    let b = idx.register_worker("b").unwrap();
    assert_eq!(b, a);
    // A holder of a's last generations that a write in flight at the drop
    // put back after the compaction: it must never count for b.
    for g in [old_gen, old_gen.wrapping_add(1)] {
        idx.map.entry(c[0].0).or_default().add(b, g, Tier::Gpu);
        let m = idx.longest_match(&c);
        assert!(m.of(b).is_none(), "generation {g}: {m:?}");
        assert_eq!(m.of(keep).map(|w| w.blocks), Some(2));
    }
    assert_eq!(
        idx.holders_of(c[0]),
        vec![("keep".to_owned(), vec![Tier::Gpu])]
    );
}

#[test]
fn a_worker_that_held_nothing_frees_its_slot_at_once() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    idx.register_worker("b").unwrap();
    idx.drop_worker("a");
    assert_eq!(
        (idx.awaiting_compaction(), idx.workers.reusable().1),
        (0, 1)
    );
    assert_eq!(idx.register_worker("c").unwrap(), a, "lowest free first");
    // A worker whose blocks were cleared (dead, not compacted) still waits.
    let d = idx.register_worker("d").unwrap();
    idx.store(d, Tier::Gpu, &chain(2, "")).unwrap();
    idx.clear_worker(d).unwrap();
    idx.drop_worker("d");
    assert_eq!(idx.awaiting_compaction(), 1);
    assert_ne!(idx.register_worker("e").unwrap(), d);
}

#[test]
fn seventy_thousand_adds_and_drops_never_run_out_of_slots() {
    let idx = CacheIndex::new();
    let keep = idx.register_worker("keep").unwrap();
    let c = chain(3, "");
    idx.store(keep, Tier::Gpu, &c[..1]).unwrap();
    for i in 0..70_000u32 {
        let id = format!("pod-{i}");
        let s = idx.register_worker(&id).unwrap();
        assert!(
            s <= 2,
            "slot {s} at cycle {i}: slots are reused lowest first"
        );
        if i % 2 == 0 {
            idx.store(s, Tier::Gpu, &c).unwrap();
        }
        assert!(idx.drop_worker(&id));
        if idx.awaiting_compaction() > 0 {
            idx.compact_dead();
        }
    }
    assert_eq!(idx.entries(), 1);
    assert_eq!(idx.longest_match(&c).of(keep).map(|w| w.blocks), Some(1));
}

#[test]
fn stale_workers_are_flagged_and_recover() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    let c = chain(3, "");
    idx.store(a, Tier::Gpu, &c).unwrap();
    idx.mark_heard(a, 1_000).unwrap();
    assert!(idx.refresh_staleness(2_000, 5_000, 60_000).is_empty());
    assert!(idx.longest_match(&c).of(a).unwrap().fresh);
    let expired = idx.refresh_staleness(70_000, 5_000, 60_000);
    assert_eq!(expired, vec!["a".to_string()]);
    assert!(!idx.longest_match(&c).of(a).unwrap().fresh);
    idx.mark_heard(a, 70_001).unwrap();
    assert!(idx.longest_match(&c).of(a).unwrap().fresh);
    let st = idx.worker_stats(70_011);
    assert_eq!(st[0].last_heard_ms_ago, Some(10));
    assert_eq!(st[0].gpu_blocks, 3);
}

#[test]
fn many_generations_wrap_safely() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    let c = chain(2, "");
    idx.store(a, Tier::Gpu, &c).unwrap();
    for _ in 0..300 {
        idx.clear_worker(a).unwrap();
    }
    assert!(idx.longest_match(&c).of(a).is_none());
}

#[test]
fn clearing_an_empty_worker_again_and_again_forces_no_compaction() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    let c = idx.register_worker("c").unwrap();
    let hs = chain(3, "");
    idx.store(c, Tier::Gpu, &hs).unwrap();
    idx.clear_worker(c).unwrap();
    // c's dead holders stay in the map until a compaction.
    assert_eq!(idx.distinct_blocks(), 3);
    for _ in 0..1000 {
        idx.clear_worker(a).unwrap();
    }
    assert_eq!(idx.distinct_blocks(), 3);
    // A worker that held blocks still compacts before its generation wraps,
    // and what it holds after that is matched.
    let ha = chain(2, "a");
    idx.store(a, Tier::Gpu, &ha).unwrap();
    for _ in 0..300 {
        idx.clear_worker(a).unwrap();
    }
    assert_eq!(idx.distinct_blocks(), 0);
    idx.store(a, Tier::Gpu, &ha[..1]).unwrap();
    assert_eq!(idx.longest_match(&ha).of(a).unwrap().blocks, 1);
}

#[test]
fn holders_of_lists_tiers() {
    let idx = CacheIndex::new();
    let a = idx.register_worker("a").unwrap();
    let c = chain(1, "");
    idx.store(a, Tier::Gpu, &c).unwrap();
    idx.store(a, Tier::Cpu, &c).unwrap();
    assert_eq!(
        idx.holders_of(c[0]),
        vec![("a".to_string(), vec![Tier::Gpu, Tier::Cpu])]
    );
    assert_eq!(idx.entries(), 2);
}

#[derive(Debug, Clone)]
enum Op {
    Store(u8, u8, u8, u8), // worker, tier, from, len
    Remove(u8, Option<u8>, u8, u8),
    Clear(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0u8..3, 0u8..12, 1u8..12).prop_map(|(w, t, f, l)| Op::Store(w, t, f, l)),
        2 => (0u8..4, proptest::option::of(0u8..3), 0u8..12, 1u8..12)
            .prop_map(|(w, t, f, l)| Op::Remove(w, t, f, l)),
        1 => (0u8..4).prop_map(Op::Clear),
    ]
}

proptest! {
    /// The index against a plain reference: worker -> set of (block, tier).
    #[test]
    fn model_based(ops in proptest::collection::vec(op(), 1..60)) {
        let idx = CacheIndex::new();
        let slots: Vec<WorkerSlot> = (0..4).map(|w| idx.register_worker(&format!("w{w}")).unwrap()).collect();
        let c = chain(16, "");
        let mut model: HashMap<u8, HashSet<(usize, u8)>> = HashMap::new();
        let tier = |t: u8| Tier::ALL[t as usize];
        for op in ops {
            match op {
                Op::Store(w, t, f, l) => {
                    let r = (f as usize).min(16)..((f + l) as usize).min(16);
                    idx.store(slots[w as usize], tier(t), &c[r.clone()]).unwrap();
                    for i in r { model.entry(w).or_default().insert((i, t)); }
                }
                Op::Remove(w, t, f, l) => {
                    let r = (f as usize).min(16)..((f + l) as usize).min(16);
                    idx.remove(slots[w as usize], t.map(tier), &c[r.clone()]).unwrap();
                    let set = model.entry(w).or_default();
                    set.retain(|(i, tt)| !(r.contains(i) && t.is_none_or(|t| t == *tt)));
                }
                Op::Clear(w) => {
                    idx.clear_worker(slots[w as usize]).unwrap();
                    model.remove(&w);
                }
            }
        }
        let m = idx.longest_match(&c);
        for w in 0..4u8 {
            let set = model.get(&w).cloned().unwrap_or_default();
            let depth = (0..16).take_while(|i| (0..3).any(|t| set.contains(&(*i, t)))).count() as u32;
            let gpu = (0..16).take_while(|i| set.contains(&(*i, 0))).count() as u32;
            let got = m.of(slots[w as usize]).copied();
            prop_assert_eq!(got.map_or(0, |g| g.blocks), depth);
            prop_assert_eq!(got.map_or(0, |g| g.gpu_blocks), gpu);
            prop_assert_eq!(idx.block_count(slots[w as usize]), set.len() as u64);
        }
        idx.compact();
        let m2 = idx.longest_match(&c);
        prop_assert_eq!(m, m2, "compaction changes nothing visible");
    }
}
