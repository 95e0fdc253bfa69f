//! Tests of `kv_aware` (the `kv` module), kept apart for its size.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::error::PolicyError;
use crate::index::MatchResult;
use crate::policy::test_util::*;
use crate::route::*;
use rand::SeedableRng;

fn kv(n: usize, threshold: u32) -> KvAware {
    let cfg = PolicyConfig {
        concurrency_threshold: threshold,
        ..Default::default()
    };
    KvAware::new(&cfg, &backends(n))
}

#[test]
fn picks_the_deepest_match() {
    let p = kv(4, 8);
    let m = matches(&[(1, 10, true), (2, 40, true)], 50);
    let input = RouteInput {
        prefix_key: 5,
        chain_blocks: 50,
        matches: Some(&m),
        ..Default::default()
    };
    let d = p.pick(&input, &Loads::new(&idle(4)), &mut rng()).unwrap();
    assert_eq!(
        (d.backend, d.kind, d.matched_blocks),
        (2, DecisionKind::KvMatch, 40)
    );
}

#[test]
fn load_outweighs_a_small_match() {
    let p = kv(2, 64);
    let m = matches(&[(0, 2, true)], 100);
    let input = RouteInput {
        prefix_key: 5,
        chain_blocks: 100,
        matches: Some(&m),
        ..Default::default()
    };
    let mut loads = idle(2);
    loads[0].pending_prefill_blocks = 500; // a long queue of cold prefills
    let d = p.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!((d.backend, d.kind), (1, DecisionKind::Spill));
}

#[test]
fn a_holder_busy_with_one_cold_prefill_keeps_its_prefix() {
    fn input_for(m: &MatchResult) -> RouteInput<'_> {
        RouteInput {
            prefix_key: 5,
            chain_blocks: 503,
            matches: Some(m),
            ..Default::default()
        }
    }
    let m = matches(&[(0, 500, true)], 503);
    let mut loads = idle(2);
    loads[0].pending_prefill_blocks = 503; // another prefix's cold prefill
    let d = kv(2, 64)
        .pick(&input_for(&m), &Loads::new(&loads), &mut rng())
        .unwrap();
    assert_eq!((d.backend, d.kind), (0, DecisionKind::KvMatch));
    // Without the miss charge the idle backend's full prefill looks as
    // cheap as waiting, and a second copy is started there.
    let cfg = PolicyConfig {
        kv: KvConfig {
            miss_weight: 0.0,
            ..Default::default()
        },
        ..Default::default()
    };
    let d = KvAware::new(&cfg, &backends(2))
        .pick(&input_for(&m), &Loads::new(&loads), &mut rng())
        .unwrap();
    assert_eq!((d.backend, d.kind), (1, DecisionKind::Spill));
    // Two cold prefills queued: now it is worth moving.
    loads[0].pending_prefill_blocks = 1100;
    let d = kv(2, 64)
        .pick(&input_for(&m), &Loads::new(&loads), &mut rng())
        .unwrap();
    assert_eq!(d.backend, 1);
}

#[test]
fn spills_when_the_match_holder_is_full() {
    let p = kv(3, 2);
    let m = matches(&[(0, 30, true), (1, 10, true)], 32);
    let input = RouteInput {
        prefix_key: 5,
        chain_blocks: 32,
        matches: Some(&m),
        ..Default::default()
    };
    let mut loads = idle(3);
    loads[0].in_flight = 2;
    let d = p.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!(
        (d.backend, d.kind, d.matched_blocks),
        (1, DecisionKind::Spill, 10)
    );
    for l in &mut loads {
        l.in_flight = 2;
    }
    let d = p.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!(d.kind, DecisionKind::LeastOutstanding);
}

#[test]
fn with_every_backend_full_the_warm_holder_is_still_chosen() {
    // Least_outstanding alone would send it to backend 1 or 2 (fewer in
    // flight) for a cold prefill of all 64 blocks.
    let p = kv(3, 2);
    let m = matches(&[(0, 60, true)], 64);
    let input = RouteInput {
        prefix_key: 5,
        chain_blocks: 64,
        matches: Some(&m),
        ..Default::default()
    };
    let mut loads = idle(3);
    loads[0].in_flight = 3;
    loads[1].in_flight = 2;
    loads[2].in_flight = 2;
    for seed in 0..16 {
        let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
        let d = p.pick(&input, &Loads::new(&loads), &mut r).unwrap();
        assert_eq!(
            (d.backend, d.kind, d.matched_blocks),
            (0, DecisionKind::KvMatch, 60)
        );
    }
    // Even behind a long queue: a full fleet gains nothing from a cold
    // prefill elsewhere.
    loads[0].pending_prefill_blocks = 200;
    let d = p.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!((d.backend, d.kind), (0, DecisionKind::KvMatch));
    // The holder also has the fewest in flight: least_outstanding, as before.
    loads[0].in_flight = 2;
    let d = p.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!((d.backend, d.kind), (0, DecisionKind::LeastOutstanding));
}

#[test]
fn with_every_backend_full_a_cold_prefix_is_placed_by_the_formula() {
    let p = kv(3, 1);
    let input = RouteInput {
        prefix_key: 9,
        chain_blocks: 32,
        matches: None,
        ..Default::default()
    };
    let mut loads = idle(3);
    for l in &mut loads {
        l.in_flight = 1;
    }
    // Backend 1 has the fewest in flight but the longest prefill queue.
    loads[0].in_flight = 2;
    loads[2].in_flight = 2;
    loads[1].pending_prefill_blocks = 10_000;
    let d = p.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
    assert_ne!(d.backend, 1);
    assert_ne!(d.kind, DecisionKind::LeastOutstanding);
}

#[test]
fn falls_back_to_prefix_hash_when_cold() {
    let p = kv(4, 8);
    let cold = matches(&[], 20);
    let loads = idle(4);
    let input = RouteInput {
        prefix_key: 77,
        chain_blocks: 20,
        matches: Some(&cold),
        ..Default::default()
    };
    let d = p.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!(d.kind, DecisionKind::PrefixHash);
    assert_eq!(Some(d.backend), p.ring.owner(77));
    // An untokenized repeat while the first one prefills follows it.
    let mut loads = loads;
    loads[d.backend].pending_prefill_blocks = 20;
    let none = RouteInput {
        prefix_key: 77,
        chain_blocks: 0,
        matches: None,
        ..Default::default()
    };
    assert_eq!(
        p.pick(&none, &Loads::new(&loads), &mut rng()).unwrap().kind,
        DecisionKind::PrefixHash
    );
}

#[test]
fn ineligible_backends_are_never_picked() {
    let p = kv(2, 8);
    let m = matches(&[(0, 9, true)], 10);
    let input = RouteInput {
        prefix_key: 1,
        chain_blocks: 10,
        matches: Some(&m),
        ..Default::default()
    };
    let mut loads = idle(2);
    loads[0].eligible = false;
    let d = p.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!(d.backend, 1);
    loads[1].eligible = false;
    assert_eq!(
        p.pick(&input, &Loads::new(&loads), &mut rng()),
        Err(PolicyError::NoBackend)
    );
}

fn cold(key: u64) -> RouteInput<'static> {
    RouteInput {
        prefix_key: key,
        chain_blocks: 500,
        matches: None,
        ..Default::default()
    }
}

#[test]
fn cold_prefixes_fill_the_backends_evenly() {
    let p = kv(7, 64);
    let loads = idle(7);
    let mut placed = [0u32; 7];
    for k in 0..112u64 {
        let d = p
            .pick(
                &cold(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                &Loads::new(&loads),
                &mut rng(),
            )
            .unwrap();
        // At idle nothing is at a limit: a cold placement is `cold` (or
        // the ring owner's `prefix_hash`), never `spill`.
        assert!(
            matches!(d.kind, DecisionKind::PrefixHash | DecisionKind::Cold),
            "{:?}",
            d.kind
        );
        placed[d.backend] += 1;
    }
    assert_eq!(placed, [16; 7]);
    // The ring alone leaves some with far more than 16.
    let ring = Ring::new(&backends(7), PolicyConfig::default().vnodes);
    let mut by_ring = [0u32; 7];
    for k in 0..112u64 {
        by_ring[ring.owner(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)).unwrap()] += 1;
    }
    assert_ne!(by_ring, [16; 7]);
}

#[test]
fn a_cold_prefix_avoids_queued_prefill_and_its_repeat_follows_it() {
    let p = kv(3, 64);
    let mut loads = idle(3);
    loads[0].pending_prefill_blocks = 1000;
    loads[2].pending_prefill_blocks = 1000;
    let d = p.pick(&cold(5), &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!(d.backend, 1);
    // Its first request is prefilling there (no blocks published yet):
    // the second request of the same prefix follows it although another
    // backend is idle now.
    loads[1].pending_prefill_blocks = 500;
    loads[2].pending_prefill_blocks = 0;
    let again = p.pick(&cold(5), &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!((again.backend, again.kind), (1, DecisionKind::PrefixHash));
    // A different cold prefix goes to the idle one.
    assert_eq!(
        p.pick(&cold(6), &Loads::new(&loads), &mut rng())
            .unwrap()
            .backend,
        2
    );
}

/// `kv_aware` over 3 backends, 100 decisions after keys 1..=4 were
/// homed on backends 0, 0, 1, 2 with 40, 30, 20, 10 requests (expected
/// loads 70 / 20 / 10; nothing decays).
fn skewed_kv(rebalance_slack: Option<f64>) -> KvAware {
    let mut cfg = PolicyConfig::default();
    cfg.kv.rebalance_slack = rebalance_slack;
    let p = KvAware::with_window(&cfg, &backends(3), 1e5);
    let mut s = p.placer.lock();
    for (key, at, reqs) in [(1u64, 0usize, 40), (2, 0, 30), (3, 1, 20), (4, 2, 10)] {
        s.rehome(key, Rehome::To(at));
        for _ in 0..reqs {
            s.record(key, at, 0);
        }
    }
    s.seq += 100;
    drop(s);
    p
}

/// A 50-block request of `key` that `holders` hold whole.
fn req<'a>(key: u64, holders: &[u16], m: &'a mut MatchResult) -> RouteInput<'a> {
    let list: Vec<(u16, u32, bool)> = holders.iter().map(|&s| (s, 50, true)).collect();
    req_with(key, &list, m)
}

/// A 50-block request of `key`; `list` is (slot, blocks, fresh).
fn req_with<'a>(key: u64, list: &[(u16, u32, bool)], m: &'a mut MatchResult) -> RouteInput<'a> {
    *m = matches(list, 50);
    let m: &'a MatchResult = m;
    RouteInput {
        prefix_key: key,
        chain_blocks: 50,
        matches: Some(m),
        ..Default::default()
    }
}

#[test]
fn a_prefix_changes_home_only_when_its_home_lost_it() {
    let p = skewed_kv(Some(0.1));
    let loads = idle(3);
    let mut m = MatchResult::default();
    let home = |p: &KvAware| p.placer.lock().home(3).unwrap().backend;
    // Key 3 lives on 1.
    // 1's agent is stale and 0 holds it too: a stale match counts as
    // published, so the home, charged only what it lacks, keeps it.
    let d = p
        .pick(
            &req_with(3, &[(1, 50, false), (0, 50, true)], &mut m),
            &Loads::new(&loads),
            &mut rng(),
        )
        .unwrap();
    assert_eq!((d.backend, home(&p)), (1, 1));
    // Its stale agent lists less than 0 holds: the request goes to 0, and
    // the home stays (a stale view decides nothing).
    let d = p
        .pick(
            &req_with(3, &[(1, 30, false), (0, 50, true)], &mut m),
            &Loads::new(&loads),
            &mut rng(),
        )
        .unwrap();
    assert_eq!((d.backend, home(&p)), (0, 1));
    // 1 lost it (fresh, no block): it lives on 0 now.
    let d = p
        .pick(&req(3, &[0], &mut m), &Loads::new(&loads), &mut rng())
        .unwrap();
    assert_eq!((d.backend, home(&p)), (0, 0));
}

#[test]
fn a_prefix_still_prefilling_is_followed() {
    let p = skewed_kv(Some(0.1));
    let mut loads = idle(3);
    let mut m = MatchResult::default();
    // Key 2's home (0, the busiest) holds none of it yet: its first
    // request there is prefilling. Its next ones follow it there.
    loads[0].pending_prefill_blocks = 50;
    for _ in 0..5 {
        let d = p
            .pick(&req(2, &[], &mut m), &Loads::new(&loads), &mut rng())
            .unwrap();
        assert_eq!((d.backend, d.kind), (0, DecisionKind::PrefixHash));
    }
}

#[test]
fn a_too_hot_prefix_gets_a_copy_until_its_load_falls() {
    let p = KvAware::with_window(&PolicyConfig::default(), &backends(3), 1e5);
    {
        let mut s = p.placer.lock();
        for (key, at, reqs) in [(1u64, 0usize, 80), (2, 1, 10), (3, 2, 10)] {
            s.rehome(key, Rehome::To(at));
            for _ in 0..reqs {
                s.record(key, at, 0);
            }
        }
        s.seq += 100;
    }
    let loads = idle(3);
    let mut m = MatchResult::default();
    // Key 1 brings 80 of 100 requests: more than the copy bound,
    // 1 + 0.75 x 0.4 = 1.3 x the mean (33), on one backend. Its next
    // request starts a copy elsewhere.
    let d = p
        .pick(&req(1, &[0], &mut m), &Loads::new(&loads), &mut rng())
        .unwrap();
    assert_eq!(d.kind, DecisionKind::Replicate);
    let copy = d.backend;
    assert_ne!(copy, 0);
    assert_eq!(p.placer.lock().home(1).unwrap().count(), 2);
    // Both hold it: its traffic goes to either, warm; 40 per holder (60
    // of a mean 47 after these 40) is within the bound, so no third copy;
    // nothing moves.
    let mut seen = [0u32; 3];
    let mut r = rng();
    for _ in 0..40 {
        let d = p
            .pick(
                &req(1, &[0, copy as u16], &mut m),
                &Loads::new(&loads),
                &mut r,
            )
            .unwrap();
        assert_eq!(d.kind, DecisionKind::KvMatch);
        seen[d.backend] += 1;
    }
    assert!(seen[0] > 5 && seen[copy] > 5, "{seen:?}");
    assert_eq!(p.placer.lock().home(1).unwrap().count(), 2);
    // The other prefixes grow: one backend serves key 1 within an even
    // share again, and the copy is dropped.
    {
        let mut s = p.placer.lock();
        for _ in 0..300 {
            s.record(2, 1, 0);
            s.record(3, 2, 0);
        }
    }
    let d = p
        .pick(
            &req(1, &[0, copy as u16], &mut m),
            &Loads::new(&loads),
            &mut rng(),
        )
        .unwrap();
    assert_eq!(d.kind, DecisionKind::KvMatch);
    assert_eq!(p.placer.lock().home(1).unwrap().count(), 1);
    // Without the balance knob nothing is copied.
    let mut cfg = PolicyConfig::default();
    cfg.kv.rebalance_slack = None;
    let off = KvAware::with_window(&cfg, &backends(3), 1e5);
    {
        let mut s = off.placer.lock();
        s.rehome(1, Rehome::To(0));
        for _ in 0..90 {
            s.record(1, 0, 0);
        }
        s.seq += 100;
    }
    let d = off
        .pick(&req(1, &[0], &mut m), &Loads::new(&loads), &mut rng())
        .unwrap();
    assert_eq!((d.backend, d.kind), (0, DecisionKind::KvMatch));
}

#[test]
fn a_copied_prefix_shares_its_traffic_under_a_key_seeded_rng() {
    // Shared decisions seed the rng by the prefix key for every request
    // (`route::pick`): a tie among the holders must still split.
    let p = KvAware::with_window(&PolicyConfig::default(), &backends(3), 1e5);
    {
        let mut s = p.placer.lock();
        for (key, at, reqs) in [(1u64, 0usize, 80), (2, 1, 10), (3, 2, 10)] {
            s.rehome(key, Rehome::To(at));
            for _ in 0..reqs {
                s.record(key, at, 0);
            }
        }
        s.seq += 100;
    }
    let loads = idle(3);
    let mut m = MatchResult::default();
    let d = p
        .pick(&req(1, &[0], &mut m), &Loads::new(&loads), &mut rng())
        .unwrap();
    assert_eq!(d.kind, DecisionKind::Replicate);
    let copy = d.backend;
    let mut seen = [0u32; 3];
    for _ in 0..40 {
        let d = p
            .pick(
                &req(1, &[0, copy as u16], &mut m),
                &Loads::new(&loads),
                &mut rng(),
            )
            .unwrap();
        assert_eq!(d.kind, DecisionKind::KvMatch);
        seen[d.backend] += 1;
    }
    assert!(seen[0] > 5 && seen[copy] > 5, "{seen:?}");
}
