use super::*;
use crate::offline::test_trace::{arb_trace, fleet, req};
use crate::optimum::{next_uses, optimum};
use proptest::prelude::*;

fn oracle(trace: &[OptRequest], f: Fleet) -> u64 {
    oracle_hits(trace, &next_uses(trace), f, 1)
}

/// Unit documents in order, one request each, at t = 0, 1, 2, ...
fn docs(seq: &[u64]) -> Vec<OptRequest> {
    seq.iter()
        .enumerate()
        .map(|(i, &d)| req(i as f64, &[d]))
        .collect()
}

#[test]
fn lru_engines_miss_what_belady_keeps() {
    // A B C A B, one backend of two blocks: LRU evicts A for C, B for A and
    // C for B (no hit); Belady bypasses C and hits A and B.
    let t = docs(&[1, 2, 3, 1, 2]);
    assert_eq!(oracle(&t, fleet(1, 2)), 0);
    let o = optimum(&t, fleet(1, 2)).unwrap();
    assert!((o.bound - 2.0 / 10.0).abs() < 1e-9, "{o:?}");
    assert_eq!(o.lru_oracle, Some(0.0));
}

#[test]
fn the_oracle_writes_where_the_victim_returns_last() {
    // Two backends of one block. A -> b0, B -> b1 (empty: evicts nothing);
    // C: b0's victim A returns at 3, b1's B at 4, so C evicts B on b1; A
    // hits on b0; B is cold again.
    let t = docs(&[1, 2, 3, 1, 2]);
    assert_eq!(oracle(&t, fleet(2, 1)), 1);
    // A B A B: each on its own backend, both hit.
    assert_eq!(oracle(&docs(&[1, 2, 1, 2]), fleet(2, 1)), 2);
}

#[test]
fn a_request_evicts_older_tails_before_shared_prefixes() {
    // One backend of four blocks. [1 2 t1]; [1 2 t2] hits 2 and fills the
    // cache; [5 t3] evicts t1, then t2 (a request's tail is its least
    // recent block, its first block the most recent), so [1 2 t4] hits 2.
    // Were the first block the least recent, [5 t3] would evict 1.
    let t = [
        req(0.0, &[1, 2, 101]),
        req(1.0, &[1, 2, 102]),
        req(2.0, &[5, 103]),
        req(3.0, &[1, 2, 104]),
    ];
    assert_eq!(oracle(&t, fleet(1, 4)), 4);
}

#[test]
fn the_oracle_honours_the_in_flight_limit() {
    // One hot document, requests overlapping (as optimum's reference): r0
    // cold on b0; r1 (b0 busy) cold on b1; r2 warm on b0; r3 warm on b1.
    let t: Vec<OptRequest> = (0..4)
        .map(|i| OptRequest {
            done: i as f64 + 1.5,
            ..req(i as f64, &[7, 8])
        })
        .collect();
    let f = Fleet {
        max_in_flight: 1,
        ..fleet(2, 4)
    };
    assert_eq!(oracle(&t, f), 4);
    assert_eq!(oracle(&t, fleet(2, 4)), 6);
}

#[test]
fn the_oracle_keeps_one_offs_off_a_hot_document() {
    // A X1 A X2 A on two backends of one block: each one-off goes where its
    // victim is not A.
    let t = docs(&[1, 50, 1, 51, 1]);
    assert_eq!(oracle(&t, fleet(2, 1)), 2);
}

#[test]
fn items_of_one_size_are_cached_whole() {
    // Documents of 3 blocks, prompts of 4 tokens: A B C A. Seven blocks hold
    // two documents: C evicts A, so A misses; nine hold all three.
    let t: Vec<OptRequest> = [1, 2, 3, 1]
        .iter()
        .enumerate()
        .map(|(i, &d)| OptRequest {
            items: vec![(d, 3)],
            prompt_tokens: 4,
            ..req(i as f64, &[])
        })
        .collect();
    let next = next_uses(&t);
    assert_eq!(lru_hits(&t, &next, fleet(1, 7)), Some(0));
    assert_eq!(lru_hits(&t, &next, fleet(1, 9)), Some(3));
    // Items of several sizes get no reference.
    let mut mixed = t.clone();
    mixed[1].items[0].1 = 2;
    assert_eq!(lru_hits(&mixed, &next, fleet(1, 9)), None);
}

#[test]
fn large_fleets_get_no_lru_references() {
    let t = docs(&[1, 1]);
    let o = optimum(&t, fleet(MAX_BACKENDS + 1, 1)).unwrap();
    assert_eq!(o.lru_oracle, None);
    assert!(optimum(&t, fleet(MAX_BACKENDS, 1))
        .unwrap()
        .lru_oracle
        .is_some());
}

proptest! {
    #[test]
    fn the_lru_references_stay_under_the_bound(trace in arb_trace(), n in 1usize..4, c in 1u64..7) {
        let o = optimum(&trace, fleet(n, c)).unwrap();
        prop_assert!(o.lru_oracle.unwrap() <= o.bound + 1e-12, "{:?}", o);
    }

    #[test]
    fn an_lru_cache_holds_whole_prefixes_within_its_capacity(trace in arb_trace(), c in 0u64..7) {
        let mut cache = Lru::fleet(fleet(1, c), 1).remove(0);
        for r in &trace {
            cache.access(&keys(r), None);
            prop_assert!(cache.0.len() as u64 <= c);
            for h in cache.0.hashes() {
                let parent = cache.0.parent_of(h).flatten();
                prop_assert!(parent.is_none_or(|p| cache.0.contains(p)));
            }
        }
    }
}
