//! Unit tests of the scale model (`scale/mod.rs`).
#![allow(clippy::unwrap_used)]
use super::*;

fn small() -> ScaleConfig {
    ScaleConfig {
        instances: 8,
        requests: 3000,
        docs: 64,
        doc_tokens: 800,
        cache_blocks: 600,
        rate_per_instance: 2.0,
        ..Default::default()
    }
}

#[test]
fn every_strategy_completes_every_request() {
    for s in Strategy::ALL {
        let mut calls = 0;
        let r = run(&small(), s, &mut |_| calls += 1).unwrap();
        assert_eq!(r.requests, 3000, "{s}");
        assert!(calls >= 1);
        assert!(r.hit_rate >= 0.0 && r.hit_rate < 1.0);
        assert!(r.ttft_ms.p50 > 0.0 && r.ttft_ms.p50 <= r.ttft_ms.p99);
        assert_eq!(r.decisions.values().sum::<u64>(), 3000);
        assert!(r.share_min_pct <= 12.5 && r.share_max_pct >= 12.5);
        assert_eq!(r.served.iter().sum::<u64>(), 3000, "{s}");
        assert_eq!(r.served_late.iter().sum::<u64>(), 1500, "{s}");
        assert!(r.served_late.iter().zip(&r.served).all(|(l, a)| l <= a));
    }
}

#[test]
fn the_second_half_counts_the_later_requests_of_an_odd_run() {
    let cfg = ScaleConfig {
        requests: 5,
        ..small()
    };
    let r = run(&cfg, Strategy::Random, &mut |_| {}).unwrap();
    // Requests 3 and 4 of 0..5 are the second half.
    assert_eq!(r.served_late.iter().sum::<u64>(), 2);
}

#[test]
fn the_routing_parts_add_up_to_the_routing_time() {
    let r = run(&small(), Strategy::KvAware, &mut |_| {}).unwrap();
    let c = &r.routing_cost;
    let parts = c.hash_us + c.match_us + c.pick_us;
    assert!(
        (parts - r.routing_us).abs() <= 1e-6 * r.routing_us.max(1.0),
        "{parts} against {}",
        r.routing_us
    );
    assert!(c.hash_us > 0.0 && c.match_us > 0.0 && c.pick_us > 0.0);
    let by_kind: BTreeMap<String, u64> = c
        .by_kind
        .iter()
        .map(|(k, v)| (k.clone(), v.decisions))
        .collect();
    assert_eq!(by_kind, r.decisions);
    let total = |f: fn(&KindCost) -> f64| -> f64 {
        c.by_kind.values().map(|k| f(k) * k.decisions as f64).sum()
    };
    let n = r.requests as f64;
    assert!((total(|k| k.pick_us) / n - c.pick_us).abs() < 1e-6);
    assert!((total(|k| k.match_us) / n - c.match_us).abs() < 1e-6);
}

#[test]
fn cache_aware_routing_beats_random_on_hits() {
    let random = run(&small(), Strategy::Random, &mut |_| {}).unwrap();
    let kv = run(&small(), Strategy::KvAware, &mut |_| {}).unwrap();
    let prefix = run(&small(), Strategy::PrefixAware, &mut |_| {}).unwrap();
    // 64 docs of 50 blocks, 12 fit per instance: random hits only the
    // popular ones, sticky routing keeps ~8 per instance warm.
    assert!(
        kv.hit_rate > random.hit_rate + 0.2,
        "{} vs {}",
        kv.hit_rate,
        random.hit_rate
    );
    assert!(prefix.hit_rate > random.hit_rate + 0.2);
    assert!(kv.ttft_ms.p50 < random.ttft_ms.p50);
    assert!(kv.decisions.get("kv_match").copied().unwrap_or(0) > 1000);
}

#[test]
fn resets_cost_hits_and_every_request_still_completes() {
    // small() runs 3000 requests at 16 req/s: about 190 s, so 19 rounds.
    let reset = ScaleConfig {
        reset_every_s: Some(10.0),
        reset_instances: 2,
        ..small()
    };
    for s in [Strategy::KvAware, Strategy::PrefixAware] {
        let calm = run(&small(), s, &mut |_| {}).unwrap();
        let wiped = run(&reset, s, &mut |_| {}).unwrap();
        assert_eq!(wiped.requests, 3000, "{s}");
        assert!(
            wiped.hit_rate < calm.hit_rate - 0.01,
            "{s}: {} vs {}",
            wiped.hit_rate,
            calm.hit_rate
        );
    }
    let every = ScaleConfig {
        reset_instances: 9,
        ..reset
    };
    assert!(every.validate().is_err());
}

#[test]
fn a_rejoin_rebuilds_the_policy_and_carries_the_others_homes() {
    let cfg = ScaleConfig {
        rejoin_every_s: Some(10.0),
        ..small()
    };
    let mut sim = Sim::new(&cfg, Strategy::KvAware).unwrap();
    for r in 0..64 {
        sim.arrive(r).unwrap();
    }
    let keys: Vec<u64> = (sim.reqs.iter())
        .map(|r| xxh3_64(&r.doc.to_le_bytes()))
        .collect();
    let homes = |sim: &Sim<'_>| -> Vec<Option<usize>> {
        let learns = sim.routers.views[0].policy.learns.as_ref().unwrap();
        let home = |k: &u64| learns.home_of(*k).map(|h| h.backend);
        keys.iter().map(home).collect()
    };
    let before = homes(&sim);
    assert!(before.contains(&Some(1)) && before.iter().any(|h| h.is_some_and(|b| b != 1)));
    sim.rejoin(1).unwrap();
    // Instance 1 left: its homes are forgotten, the others' carried over.
    let want: Vec<Option<usize>> = before.iter().map(|h| h.filter(|&b| b != 1)).collect();
    assert_eq!(homes(&sim), want);
    // A whole run with a flap every 10 s completes every request.
    let r = run(&cfg, Strategy::KvAware, &mut |_| {}).unwrap();
    assert_eq!(r.requests, 3000);
    let bad = ScaleConfig {
        rejoin_every_s: Some(0.0),
        ..small()
    };
    assert!(bad.validate().is_err());
}

#[test]
fn a_reset_instance_holds_nothing_and_the_index_forgets_it() {
    let index = CacheIndex::with_capacity(64);
    let slot = index.register_worker("w").unwrap();
    let mut inst = fleet::Instance::new(slot, 16);
    let hashes: Vec<BlockHash> = (1..=4).map(BlockHash).collect();
    inst.insert(7, &hashes, 4, 1, None, Some(&index)).unwrap();
    assert_eq!(
        index.longest_match(&hashes).of(slot).map(|w| w.blocks),
        Some(4)
    );
    inst.clear(Some(&index)).unwrap();
    assert!(!inst.holds(7));
    assert_eq!(inst.used_blocks(), 0);
    assert_eq!(
        index.longest_match(&hashes).of(slot).map(|w| w.blocks),
        None
    );
}

#[test]
fn the_same_seed_gives_the_same_result() {
    let a = run(&small(), Strategy::KvAware, &mut |_| {}).unwrap();
    let b = run(&small(), Strategy::KvAware, &mut |_| {}).unwrap();
    assert_eq!(a.hit_rate, b.hit_rate);
    assert_eq!(a.ttft_ms, b.ttft_ms);
}

#[test]
fn replicas_share_the_index_and_still_hit() {
    let one = run(&small(), Strategy::KvAware, &mut |_| {}).unwrap();
    let three = ScaleConfig {
        routers: 3,
        load_report_ms: 100,
        ..small()
    };
    let random = run(&three, Strategy::Random, &mut |_| {}).unwrap();
    let kv = run(&three, Strategy::KvAware, &mut |_| {}).unwrap();
    assert_eq!((kv.routers, kv.requests), (3, 3000));
    // The replicas route on the one shared index: warm prefixes still
    // go where they are cached, far above random.
    assert!(
        kv.hit_rate > random.hit_rate + 0.2,
        "{} vs {}",
        kv.hit_rate,
        random.hit_rate
    );
    // ... but each replica places cold prefixes on its own: the
    // figures differ from one router's.
    assert_ne!(kv.ttft_ms, one.ttft_ms);
}

#[test]
fn replicas_that_share_decisions_place_as_one_router() {
    let cfg = |routers, share_delay_ms| ScaleConfig {
        routers,
        share_delay_ms,
        load_report_ms: 100,
        ..small()
    };
    let one = run(&cfg(1, None), Strategy::KvAware, &mut |_| {}).unwrap();
    let blind = run(&cfg(3, None), Strategy::KvAware, &mut |_| {}).unwrap();
    let shared = run(&cfg(3, Some(1.0)), Strategy::KvAware, &mut |_| {}).unwrap();
    let gap = |r: &ScaleReport| (r.hit_rate - one.hit_rate).abs();
    assert!(
        gap(&shared) < gap(&blind),
        "one {} blind {} shared {}",
        one.hit_rate,
        blind.hit_rate,
        shared.hit_rate
    );
    // Sharing with one router is no sharing at all.
    let alone = run(&cfg(1, Some(1.0)), Strategy::KvAware, &mut |_| {}).unwrap();
    assert_eq!(alone.ttft_ms, one.ttft_ms);
}

#[test]
fn bad_configs_are_refused() {
    let bad = ScaleConfig {
        instances: 0,
        ..small()
    };
    assert!(run(&bad, Strategy::Random, &mut |_| {}).is_err());
    let bad = ScaleConfig {
        share_delay_ms: Some(-1.0),
        ..small()
    };
    assert!(run(&bad, Strategy::Random, &mut |_| {}).is_err());
    let bad = ScaleConfig {
        rate_per_instance: -1.0,
        ..small()
    };
    assert!(run(&bad, Strategy::Random, &mut |_| {}).is_err());
    let bad = ScaleConfig {
        routers: 0,
        ..small()
    };
    assert!(run(&bad, Strategy::Random, &mut |_| {}).is_err());
}

#[test]
fn the_report_carries_the_bound_and_the_lru_references() {
    let r = run(&small(), Strategy::KvAware, &mut |_| {}).unwrap();
    let o = r.optimum.unwrap();
    let oracle = o.lru_oracle.unwrap();
    assert!(oracle > 0.0 && oracle <= o.bound, "{o:?}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["optimum"]["lru_oracle"], oracle);
    let cell = crate::optimum::cell(r.hit_rate, None, r.optimum);
    assert!(
        cell.contains(&format!("LRU oracle {:.1}%", 100.0 * oracle)),
        "{cell}"
    );
}
