//! Cold placement against its reference: [`State::place`] computes each
//! backend's terms once and skips the ring walk for a unique winner; on
//! random histories it places exactly where the straightforward scan (the
//! formula re-evaluated per rule, the ring walked every time) does.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::kv::*;
use crate::policy::test_util::*;
use proptest::prelude::*;

/// The reference: the placement rule as written before (main `ddbc1cd`,
/// with the admission threshold and turnover term), one scan per rule.
#[allow(clippy::too_many_arguments)]
fn place_scan(
    s: &State,
    key: u64,
    blocks: u32,
    loads: &[BackendLoad],
    usable: impl Fn(usize) -> bool,
    ring: &Ring,
    weights: (f64, f64, f64),
    band: f64,
) -> Option<(usize, Placed)> {
    if let Some(h) = s.homes.get(key) {
        if usable(h.backend as usize) && s.following(&h, loads) {
            return Some((h.backend as usize, Placed::Remembered));
        }
    }
    let (prefill_weight, miss_weight, decode_weight) = weights;
    let n = loads.len().min(s.pressure.len());
    // A tail prefix (less popular than what the caches can keep) goes,
    // among the backends as good, where the cache turns over fastest:
    // the tail's churn stays on the backends already churning. Any
    // other prefix pays for what the LRU would trim of it there.
    let tail = s.homes.get(key).map_or(0.0, |h| h.pop) + s.unit < s.tail_threshold(blocks);
    let evict: Vec<f64> = if s.resident.any() {
        (0..n)
            .map(|b| {
                let lost = if tail {
                    0.0
                } else {
                    s.lost_cost(b, key, blocks)
                };
                s.evict_cost(b, key, blocks) + lost
            })
            .collect()
    } else {
        vec![0.0; n]
    };
    // Where the capacity is known the eviction term replaces pressure,
    // its proxy: a backend that turns over only cold prefixes is the
    // right place for one more.
    let write = |b: usize| match s.resident.of(b) {
        Some(_) => evict[b],
        None => s.pressure[b] / s.unit,
    };
    let cost = |b: usize| {
        let l = &loads[b];
        miss_weight * write(b)
            + prefill_weight * l.pending_prefill_blocks as f64
            + decode_weight * f64::from(l.effective_in_flight())
    };
    let min = (0..n)
        .filter(|&b| usable(b))
        .map(cost)
        .min_by(f64::total_cmp)?;
    // The band evens loads among backends as good for the caches: never
    // at the price of evicting hotter prefixes than the least-loss one.
    let least_loss = (0..n)
        .filter(|&b| usable(b))
        .map(|b| evict[b])
        .min_by(f64::total_cmp)?;
    let fit_band = FIT_BAND * f64::from(blocks);
    let good =
        |b: usize| b < n && usable(b) && cost(b) <= min + band && evict[b] <= least_loss + fit_band;
    let expected = s.homes.loads();
    // The tail concentrates only on backends not far above the mean
    // expected load: where it carries more than a fair share of the
    // traffic, its cold prefills queue; then the lowest load wins.
    let usable_n = (0..n).filter(|&b| usable(b)).count().max(1) as f64;
    let mean = (0..n)
        .filter(|&b| usable(b))
        .map(|b| expected[b])
        .sum::<f64>()
        / usable_n;
    let light = |b: usize| expected[b] <= TAIL_LOAD_MAX * mean;
    let tail = tail && (0..n).any(|b| good(b) && light(b));
    let good = |b: usize| good(b) && (!tail || light(b));
    let rank = |b: usize| {
        if tail {
            -s.pressure[b]
        } else {
            expected[b]
        }
    };
    let least = (0..n)
        .filter(|&b| good(b))
        .map(rank)
        .min_by(f64::total_cmp)?;
    // Exact ties (an idle fleet) go by the ring, so the walk is short:
    // it stops at the first tied backend.
    let at = ring.walk(key).find(|&b| good(b) && rank(b) <= least)?;
    let owner = ring.walk(key).find(|&b| b < n && usable(b));
    let how = if owner == Some(at) {
        Placed::RingOwner
    } else {
        Placed::Pressure
    };
    Some((at, how))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random histories of records, homes and cached chains on fleets with
    /// and without a capacity model; every placement agrees.
    #[test]
    fn placement_is_the_reference_scan(
        n in 1usize..12,
        capacity in prop_oneof![Just(None), Just(Some(64u64)), Just(Some(400u64))],
        history in proptest::collection::vec((0u64..12, 0usize..12, 0u32..80), 0..80),
        probes in proptest::collection::vec(
            (0u64..16, 1u32..80, proptest::collection::vec((any::<bool>(), 0u32..4, 0u64..100), 12)),
            1..10,
        ),
        band in prop_oneof![Just(0.0), 0.0f64..100.0],
    ) {
        let mut bs = backends(n);
        for b in &mut bs {
            b.capacity_blocks = capacity;
        }
        let ring = Ring::new(&bs, 16);
        let placer = Mutex::new(State::new(&bs, 8.0));
        let mut s = placer.lock();
        for &(key, at, blocks) in &history {
            let at = at % n;
            if blocks % 3 == 0 {
                s.rehome(key, Rehome::To(at));
            }
            s.record(key, at, blocks);
            s.cached(key, at, blocks);
        }
        s.seq += 100;
        for (key, blocks, raw) in &probes {
            let loads: Vec<BackendLoad> = raw[..n]
                .iter()
                .map(|&(eligible, in_flight, queued)| BackendLoad {
                    eligible,
                    in_flight,
                    pending_prefill_blocks: queued,
                    engine: None,
                })
                .collect();
            let usable = |i: usize| loads.get(i).is_some_and(|l| l.eligible && l.in_flight < 3);
            let w = (1.0, 1.0, 2.0);
            let fast = s.place(*key, *blocks, &loads, usable, &ring, w, band);
            let scan = place_scan(&s, *key, *blocks, &loads, usable, &ring, w, band);
            prop_assert_eq!(fast, scan);
        }
    }
}
