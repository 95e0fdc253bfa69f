//! Unit tests of cold placement ([`super`]).

use super::*;
use crate::policy::kv::*;
use crate::policy::test_util::*;

#[test]
fn pressure_decays_and_spreads_new_prefixes() {
    let b = backends(4);
    let ring = Ring::new(&b, 160);
    let placer = Mutex::new(State::new(&b, 100.0));
    let mut p = placer.lock();
    let loads = idle(4);
    let mut placed = [0u32; 4];
    // 40 distinct cold prefixes of 500 blocks: 10 on each backend.
    for key in 0..40u64 {
        let key = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let (at, _) = p
            .place(key, 500, &loads, |_| true, &ring, (0.0, 1.0, 0.0), 0.0)
            .unwrap();
        p.rehome(key, Rehome::To(at));
        p.record(key, at, 500);
        placed[at] += 1;
    }
    assert_eq!(placed, [10; 4]);
    let before = p.pressures();
    for _ in 0..400 {
        p.record(1, 0, 0);
    }
    let after = p.pressures();
    assert!(
        after[1] < before[1] && after[1] > 0.0,
        "{before:?} {after:?}"
    );
}

#[test]
fn a_placement_is_sticky_while_it_prefills() {
    let b = backends(3);
    let ring = Ring::new(&b, 160);
    let placer = Mutex::new(State::new(&b, 100.0));
    let mut p = placer.lock();
    let mut loads = idle(3);
    let (first, _) = p
        .place(42, 500, &loads, |_| true, &ring, (1.0, 1.0, 2.0), 0.0)
        .unwrap();
    p.rehome(42, Rehome::To(first));
    p.record(42, first, 500);
    loads[first].pending_prefill_blocks = 500;
    // Its pressure and queue now make it the costliest, yet the same key
    // follows it.
    assert_eq!(
        p.place(42, 500, &loads, |_| true, &ring, (1.0, 1.0, 2.0), 0.0),
        Some((first, Placed::Remembered))
    );
    // Another key does not.
    let (other, _) = p
        .place(43, 500, &loads, |_| true, &ring, (1.0, 1.0, 2.0), 0.0)
        .unwrap();
    assert_ne!(other, first);
    p.rehome(43, Rehome::To(other));
    p.record(43, other, 500);
    // Done prefilling and many decisions later: placed afresh.
    loads[first].pending_prefill_blocks = 0;
    for _ in 0..100 {
        p.record(7, other, 0);
    }
    let (again, how) = p
        .place(42, 500, &loads, |_| true, &ring, (1.0, 1.0, 2.0), 0.0)
        .unwrap();
    assert_ne!(how, Placed::Remembered);
    // The least pressure: neither the first (500 blocks) nor `other`.
    assert!(again != first && again != other, "{again}");
    // An unusable remembered backend is never returned.
    loads[first].pending_prefill_blocks = 500;
    p.rehome(42, Rehome::To(first));
    p.record(42, first, 500);
    let (b2, _) = p
        .place(42, 500, &loads, |i| i != first, &ring, (1.0, 1.0, 2.0), 0.0)
        .unwrap();
    assert_ne!(b2, first);
    assert_eq!(
        p.place(42, 500, &loads, |_| false, &ring, (1.0, 1.0, 2.0), 0.0),
        None
    );
}

#[test]
fn within_the_tolerance_the_least_requested_backend_wins() {
    let b = backends(3);
    let ring = Ring::new(&b, 160);
    let placer = Mutex::new(State::new(&b, 100.0));
    let mut p = placer.lock();
    let loads = idle(3);
    let w = (1.0, 1.0, 2.0);
    // One 500-block prefix each; then backend 1 serves 30 full hits
    // (nothing written) and backend 2 five requests writing 20 blocks:
    // 1 has the lower pressure, 2 the lower share of requests.
    for (key, at) in [(1u64, 0usize), (2, 1), (3, 2)] {
        p.rehome(key, Rehome::To(at));
        p.record(key, at, 500);
    }
    for _ in 0..30 {
        p.record(2, 1, 0);
    }
    for _ in 0..5 {
        p.record(3, 2, 20);
    }
    let pick = |usable: &dyn Fn(usize) -> bool, loads: &[BackendLoad], tol| {
        p.place(9, 500, loads, usable, &ring, w, tol).unwrap().0
    };
    assert_eq!(pick(&|_| true, &loads, 0.0), 0);
    assert_eq!(pick(&|i| i != 0, &loads, 0.0), 1);
    // Within one prefix's blocks of the least pressure: least requested.
    assert_eq!(pick(&|i| i != 0, &loads, 503.0), 2);
    // A queued cold prefill puts backend 2 outside the tolerance.
    let mut busy = idle(3);
    busy[2].pending_prefill_blocks = 1000;
    assert_eq!(pick(&|i| i != 0, &busy, 503.0), 1);
}

/// `n` backends whose caches hold 1000 blocks each.
fn of_1000_blocks(n: usize) -> Vec<PolicyBackend> {
    backends(n)
        .into_iter()
        .map(|b| PolicyBackend {
            capacity_blocks: Some(1000),
            ..b
        })
        .collect()
}

#[test]
fn a_cold_prefix_goes_where_it_evicts_the_coldest() {
    // Three backends of 1000 blocks, each full with two 500-block
    // prefixes: 0 and 1 hold two of 50 requests each, 2 one of 150 and,
    // least recently used, one of a single request.
    let b = of_1000_blocks(3);
    let ring = Ring::new(&b, 160);
    let filled = |b: &[PolicyBackend]| {
        let placer = Mutex::new(State::new(b, 1e5));
        {
            let mut p = placer.lock();
            for (key, at, reqs) in [
                (6u64, 2usize, 1),
                (1, 0, 50),
                (2, 0, 50),
                (3, 1, 50),
                (4, 1, 50),
                (5, 2, 150),
            ] {
                p.rehome(key, Rehome::To(at));
                for _ in 0..reqs {
                    p.record(key, at, 0);
                    p.cached(key, at, 500);
                }
            }
            p.seq += 100;
        }
        placer
    };
    let loads = idle(3);
    let w = (1.0, 1.0, 2.0);
    // Backend 2 carries the most load, but there the new prefix evicts
    // only the one-request prefix: it goes there.
    let placer = filled(&b);
    let p = placer.lock();
    let (at, _) = p.place(9, 500, &loads, |_| true, &ring, w, 500.0).unwrap();
    assert_eq!(at, 2);
    assert!(p.evict_cost(0, 9, 500) > 450.0 && p.evict_cost(2, 9, 500) < 300.0);
    // Capacity unknown: no eviction term, the lowest expected load wins.
    let blind = filled(&backends(3));
    let q = blind.lock();
    let (at, _) = q.place(9, 500, &loads, |_| true, &ring, w, 500.0).unwrap();
    assert_ne!(at, 2);
    assert_eq!(q.evict_cost(2, 9, 500), 0.0);
}

#[test]
fn a_cold_prefix_goes_where_it_fits() {
    // Backend 0 holds one popular 500-block prefix (room for another),
    // backend 1 is full with two of five requests each.
    let b = of_1000_blocks(2);
    let ring = Ring::new(&b, 160);
    let run = |b: &[PolicyBackend]| {
        let placer = Mutex::new(State::new(b, 1e5));
        let mut p = placer.lock();
        for (key, at, reqs) in [(1u64, 0usize, 100), (2, 1, 5), (3, 1, 5)] {
            p.rehome(key, Rehome::To(at));
            for _ in 0..reqs {
                p.record(key, at, 0);
                p.cached(key, at, 500);
            }
        }
        p.seq += 100;
        let (at, _) = p
            .place(9, 500, &idle(2), |_| true, &ring, (1.0, 1.0, 2.0), 500.0)
            .unwrap();
        at
    };
    // It fits on 0, although 0 carries the most load.
    assert_eq!(run(&b), 0);
    // Capacity unknown: the lower expected load, 1, where it evicts.
    assert_eq!(run(&backends(2)), 1);
}

/// Backend 1 churns: 100 one-off prefixes of two requests each passed
/// through it, writing 500 blocks apiece; its model holds the last two.
fn churn(p: &mut State, at: usize) {
    for key in 1000..1100u64 {
        p.rehome(key, Rehome::To(at));
        p.record(key, at, 500);
        p.record(key, at, 0);
        p.cached(key, at, 500);
    }
}

#[test]
fn a_tail_prefix_goes_where_the_tail_churns_unless_that_is_overloaded() {
    // 3 backends of 1000 blocks, full: 0 with two prefixes of two
    // requests each, 1 with two hot ones of `hot` requests, 2 churning
    // through one-offs of two requests each. The caches keep 4 prefixes
    // beyond one backend's worth; the new prefix, seen once, is colder
    // than the 4th most popular: a tail one.
    let b = of_1000_blocks(3);
    let ring = Ring::new(&b, 160);
    let place = |hot: usize| {
        let placer = Mutex::new(State::new(&b, 1e5));
        let mut p = placer.lock();
        for (key, at, reqs) in [(1u64, 0usize, 2), (2, 0, 2), (3, 1, hot), (4, 1, hot)] {
            p.rehome(key, Rehome::To(at));
            for _ in 0..reqs {
                p.record(key, at, 0);
            }
            p.cached(key, at, 500);
        }
        churn(&mut p, 2);
        p.seq += 100;
        assert!(p.tail_threshold(500) > p.unit, "one request is below it");
        // On 0 and 2 it evicts the same (a two-request prefix).
        assert!((p.evict_cost(0, 9, 500) - p.evict_cost(2, 9, 500)).abs() < 1.0);
        let (at, _) = p
            .place(9, 500, &idle(3), |_| true, &ring, (1.0, 1.0, 2.0), 500.0)
            .unwrap();
        at
    };
    // 2 carries more expected load than 0 (200 against 4, mean 168),
    // but its cache turns over anyway: 0 keeps what it holds.
    assert_eq!(place(150), 2);
    // With the mean at 101, 2 is more than 1.4 times it: the tail's
    // cold prefills would queue there; the lowest load wins.
    assert_eq!(place(50), 0);
}

#[test]
fn a_kept_prefix_avoids_a_cache_that_turns_over_faster_than_it_returns() {
    // 2 backends of 1000 blocks: 0 holds a 10-request prefix (least
    // recently used) and a 100-request one; 1 churns through one-offs.
    // Prefix 9 (45 requests, lost from 1) is among the 2 the caches keep.
    let b = of_1000_blocks(2);
    let ring = Ring::new(&b, 160);
    let placer = Mutex::new(State::new(&b, 1e5));
    let mut p = placer.lock();
    for (key, reqs) in [(2u64, 10), (1, 100)] {
        p.rehome(key, Rehome::To(0));
        for _ in 0..reqs {
            p.record(key, 0, 0);
        }
        p.cached(key, 0, 500);
    }
    churn(&mut p, 1);
    p.rehome(9, Rehome::To(1));
    for _ in 0..45 {
        p.record(9, 1, 0);
    }
    p.seq += 100;
    // Evicting on 1 costs little (its victims are one-offs), but 1
    // writes 500 blocks every 2 decisions, its whole cache in about 4:
    // prefix 9 is mostly trimmed there before it returns; 0 writes
    // nothing.
    assert!(p.evict_cost(1, 9, 500) < 30.0 && p.evict_cost(0, 9, 500) > 80.0);
    assert!(p.lost_cost(1, 9, 500) > 150.0 && p.lost_cost(0, 9, 500) == 0.0);
    let (at, _) = p
        .place(9, 500, &idle(2), |_| true, &ring, (1.0, 1.0, 2.0), 500.0)
        .unwrap();
    assert_eq!(at, 0, "it evicts the 10-request prefix on 0 instead");
}
