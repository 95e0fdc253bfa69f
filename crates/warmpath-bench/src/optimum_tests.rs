use super::*;
use crate::offline::test_trace::{arb_trace, fleet, req};
use proptest::prelude::*;

fn pooled(trace: &[OptRequest], capacity: u64) -> u64 {
    pooled_hits(trace, &next_uses(trace), capacity)
}

#[test]
fn belady_keeps_what_comes_back_first() {
    // Room for one block: A B A. LRU keeps B and misses A; Belady bypasses B.
    let t = [req(0.0, &[1]), req(1.0, &[2]), req(2.0, &[1])];
    assert_eq!(pooled(&t, 1), 1);
    // A B C A B with room for two: keep A and B, bypass C: two hits.
    let t = [
        req(0.0, &[1]),
        req(1.0, &[2]),
        req(2.0, &[3]),
        req(3.0, &[1]),
        req(4.0, &[2]),
    ];
    assert_eq!(pooled(&t, 2), 2);
    assert_eq!(pooled(&t, 3), 2);
    assert_eq!(pooled(&t, 1), 1);
}

#[test]
fn the_bound_pools_the_fleets_blocks() {
    // Two documents of two blocks, alternating: four pooled blocks hold both.
    let t: Vec<OptRequest> = (0..6)
        .map(|i| {
            let d = (i % 2) * 10;
            req(i as f64, &[d, d + 1])
        })
        .collect();
    assert_eq!(pooled(&t, 4), 8);
    let o = optimum(&t, fleet(2, 2)).unwrap();
    assert!((o.bound - 8.0 / 18.0).abs() < 1e-9, "{o:?}");
}

#[test]
fn the_engine_cap_and_whole_items_are_honoured() {
    // A full hit of a 2-block prompt of exactly 2 tokens recomputes the last.
    let mut t = vec![req(0.0, &[1, 2]), req(1.0, &[1, 2])];
    t[1].prompt_tokens = 2;
    assert_eq!(
        crate::lru_refs::lru_hits(&t, &next_uses(&t), fleet(1, 4)),
        Some(1)
    );
    // An item of 3 blocks in a 4-block pooled capacity: kept whole.
    let doc = |t: f64| OptRequest {
        items: vec![(5, 3)],
        ..req(t, &[])
    };
    let t = [doc(0.0), doc(1.0)];
    assert_eq!(pooled(&t, 4), 3);
    assert_eq!(
        pooled(&t, 2),
        3,
        "the capacity is rounded up to whole items"
    );
    assert_eq!(optimum(&[], fleet(1, 1)), None);
}

/// The best number of hits any caching of `capacity` unit items can get on
/// the flattened access sequence `seq`, by trying every choice.
fn brute(seq: &[u64], capacity: usize, held: &mut Vec<u64>) -> u64 {
    let Some((&x, rest)) = seq.split_first() else {
        return 0;
    };
    if held.contains(&x) {
        return 1 + brute(rest, capacity, held);
    }
    let mut best = brute(rest, capacity, held); // bypass
    if held.len() < capacity {
        held.push(x);
        best = best.max(brute(rest, capacity, held));
        held.pop();
    } else {
        for i in 0..held.len() {
            let old = std::mem::replace(&mut held[i], x);
            best = best.max(brute(rest, capacity, held));
            held[i] = old;
        }
    }
    best
}

/// An online router: `n` LRU caches of `c` blocks (vLLM keeps every block of
/// a request), routing by `pick`; returns the prefix blocks it hits.
fn online(
    trace: &[OptRequest],
    n: usize,
    c: usize,
    pick: &mut dyn FnMut(&[Vec<u64>], &OptRequest) -> usize,
) -> u64 {
    let mut caches: Vec<Vec<u64>> = vec![Vec::new(); n]; // LRU first
    let mut hits = 0;
    for r in trace {
        let b = pick(&caches, r) % n;
        let cache = &mut caches[b];
        hits += r
            .items
            .iter()
            .take_while(|(id, _)| cache.contains(id))
            .count() as u64;
        for &(id, _) in &r.items {
            cache.retain(|&x| x != id);
            cache.push(id);
            if cache.len() > c {
                cache.remove(0);
            }
        }
    }
    hits
}

proptest! {
    #[test]
    fn belady_equals_the_brute_force(seq in prop::collection::vec(0u64..4, 0..9), cap in 1usize..4) {
        let trace: Vec<OptRequest> = seq.iter().enumerate().map(|(i, &x)| req(i as f64, &[x])).collect();
        prop_assert_eq!(pooled(&trace, cap as u64), brute(&seq, cap, &mut Vec::new()));
    }

    #[test]
    fn no_online_router_beats_the_bound(trace in arb_trace(), n in 1usize..4, c in 1usize..7, seed in any::<u64>()) {
        let bound = pooled(&trace, (n * c) as u64);
        let mut rng = seed;
        let mut random = |_: &[Vec<u64>], _: &OptRequest| {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) as usize
        };
        prop_assert!(online(&trace, n, c, &mut random) <= bound);
        let mut warmest = |caches: &[Vec<u64>], r: &OptRequest| {
            (0..caches.len())
                .max_by_key(|&b| r.items.iter().take_while(|(id, _)| caches[b].contains(id)).count())
                .unwrap_or(0)
        };
        prop_assert!(online(&trace, n, c, &mut warmest) <= bound);
        let mut by_doc = |_: &[Vec<u64>], r: &OptRequest| r.items.first().map_or(0, |i| (i.0 / 100) as usize);
        prop_assert!(online(&trace, n, c, &mut by_doc) <= bound);
    }
}

#[test]
fn documents_and_cells() {
    let docs = [(0.0, 0.1, 3), (1.0, 1.1, 3), (2.0, 2.1, 4)].into_iter();
    let f = Fleet {
        block_size: 16,
        ..fleet(2, 10)
    };
    // 3 prompts of 100 tokens; the second reads document 3's 6 blocks again.
    let o = of_documents(docs, 6, 100, f).unwrap();
    assert!((o.bound - 96.0 / 300.0).abs() < 1e-9, "{o:?}");
    assert_eq!(cell(0.5, None, None), "50.0%");
    assert_eq!(
        cell(0.5, Some(0.9), Some(o)),
        "50.0% (ceiling 90.0%, bound 32.0%, LRU oracle 32.0%)"
    );
    let belady_only = Optimum {
        lru_oracle: None,
        ..o
    };
    assert_eq!(cell(0.5, None, Some(belady_only)), "50.0% (bound 32.0%)");
}
