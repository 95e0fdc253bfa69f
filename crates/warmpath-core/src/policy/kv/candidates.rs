//! `kv_aware`'s warm pick in O(holders + load buckets) (docs/kv.md, "Pick mechanics"):
//! exactly the full scan ([`cheapest_scan`]), draws included (proptest).

use super::tuning::KvConfig;
use crate::route::BackendLoad;
use rand::RngCore;
use std::collections::BTreeMap;

/// The holders of a request's chain: (position, matched blocks > 0), ascending.
#[derive(Clone, Debug, Default)]
pub(crate) struct Held(pub(crate) Vec<(u32, u32)>);

impl Held {
    pub(crate) fn get(&self, i: usize) -> u32 {
        self.0
            .binary_search_by_key(&i, |&(p, _)| p as usize)
            .map_or(0, |at| self.0[at].1)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.0.iter().map(|&(p, m)| (p as usize, m))
    }
}

/// The warm cost formula; `at_home`: a holder (or there is none), so it writes what it lacks.
pub(crate) fn warm_cost(
    kv: &KvConfig,
    chain: u32,
    m: u32,
    queued: u64,
    in_flight: u32,
    at_home: bool,
) -> f64 {
    let uncached = f64::from(chain - m.min(chain));
    let write = if at_home { uncached } else { f64::from(chain) };
    kv.prefill_weight * (uncached + queued as f64)
        + kv.miss_weight * write
        + kv.decode_weight * f64::from(in_flight)
}

/// A bucket: the load term (a non-negative `f64`'s bits order like it), then the exact loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LoadKey {
    term_bits: u64,
    pub(crate) queued: u64,
    pub(crate) in_flight: u32,
}

impl LoadKey {
    /// The load term `prefill_weight * queued + decode_weight * in_flight`.
    pub(crate) fn term(&self) -> f64 {
        f64::from_bits(self.term_bits)
    }
}

/// Usable backends by load bucket.
#[derive(Clone, Debug)]
pub(crate) struct Candidates {
    /// Per position: its bucket, `None` when not usable.
    filed: Vec<Option<LoadKey>>,
    /// Bucket -> its positions, ascending.
    buckets: BTreeMap<LoadKey, Vec<u32>>,
    /// Eligible positions (usable or full).
    eligible: usize,
    flags: Vec<bool>,
    /// Whether every position was compared once (a change list is relative to a full view).
    synced: bool,
    prefill_weight: f64,
    decode_weight: f64,
    threshold: u32,
}

impl Candidates {
    /// None usable until the first [`Self::sync`].
    pub(crate) fn new(n: usize, prefill_weight: f64, decode_weight: f64, threshold: u32) -> Self {
        Candidates {
            filed: vec![None; n],
            buckets: BTreeMap::new(),
            eligible: 0,
            flags: vec![false; n],
            synced: false,
            prefill_weight,
            decode_weight,
            threshold,
        }
    }

    /// `None` when it cannot take a request (ineligible, or at the concurrency threshold).
    fn key_of(&self, l: &BackendLoad) -> Option<LoadKey> {
        let in_flight = l.effective_in_flight();
        if !l.eligible || in_flight >= self.threshold {
            return None;
        }
        let queued = l.pending_prefill_blocks;
        let term = self.prefill_weight * queued as f64 + self.decode_weight * f64::from(in_flight);
        Some(LoadKey {
            term_bits: term.to_bits(),
            queued,
            in_flight,
        })
    }

    /// Refiles the positions whose load changed: `changed` (a superset is fine), else every one.
    pub(crate) fn sync(&mut self, loads: &[BackendLoad], changed: Option<&[usize]>) {
        match changed {
            Some(changed) if self.synced && loads.len() == self.filed.len() => {
                for &i in changed {
                    if let Some(l) = loads.get(i) {
                        self.sync_at(i, l);
                    }
                }
            }
            _ => self.sync_all(loads),
        }
        self.synced = true;
    }

    fn sync_all(&mut self, loads: &[BackendLoad]) {
        for (i, l) in loads.iter().enumerate().take(self.filed.len()) {
            self.sync_at(i, l);
        }
        // A short slice (never, by the `Policy` contract): the rest are out.
        for i in loads.len()..self.filed.len() {
            self.eligible -= usize::from(std::mem::take(&mut self.flags[i]));
            self.refile(i, None);
        }
    }

    fn sync_at(&mut self, i: usize, l: &BackendLoad) {
        self.eligible = self.eligible + usize::from(l.eligible) - usize::from(self.flags[i]);
        self.flags[i] = l.eligible;
        let key = self.key_of(l);
        if key != self.filed[i] {
            self.refile(i, key);
        }
    }

    fn refile(&mut self, i: usize, key: Option<LoadKey>) {
        let pos = i as u32;
        if let Some(old) = self.filed[i] {
            if let Some(b) = self.buckets.get_mut(&old) {
                if let Ok(at) = b.binary_search(&pos) {
                    b.remove(at);
                }
                if b.is_empty() {
                    self.buckets.remove(&old);
                }
            }
        }
        if let Some(new) = key {
            let b = self.buckets.entry(new).or_default();
            if let Err(at) = b.binary_search(&pos) {
                b.insert(at, pos);
            }
        }
        self.filed[i] = key;
    }

    pub(crate) fn usable(&self, i: usize) -> bool {
        self.filed.get(i).is_some_and(Option::is_some)
    }

    pub(crate) fn key(&self, i: usize) -> Option<LoadKey> {
        self.filed.get(i).copied().flatten()
    }

    pub(crate) fn any_eligible(&self) -> bool {
        self.eligible > 0
    }

    /// Least load term first.
    pub(crate) fn buckets(&self) -> impl Iterator<Item = (&LoadKey, &[u32])> {
        self.buckets.iter().map(|(k, v)| (k, v.as_slice()))
    }

    /// The lowest-cost usable backend and its match; `homes`: the prefix's holders, sorted.
    pub(crate) fn cheapest(
        &self,
        kv: &KvConfig,
        chain: u32,
        held: &Held,
        homes: &[usize],
        rng: &mut dyn RngCore,
    ) -> Option<(u32, usize)> {
        let mut best: Option<(f64, u32)> = None;
        let mut tied: Vec<u32> = Vec::new();
        for (i, m) in held.iter() {
            let Some(key) = self.key(i) else { continue };
            let at_home = homes.is_empty() || homes.binary_search(&i).is_ok();
            let cost = warm_cost(kv, chain, m, key.queued, key.in_flight, at_home);
            match best {
                Some((c, bm)) if cost > c || (cost == c && m < bm) => {}
                Some((c, bm)) if cost == c && m == bm => tied.push(i as u32),
                _ => {
                    best = Some((cost, m));
                    tied.clear();
                    tied.push(i as u32);
                }
            }
        }
        // Non-holders: m = 0, so no holder ties with them.
        let base = kv.prefill_weight * f64::from(chain) + kv.miss_weight * f64::from(chain);
        let mut lists: Vec<&[u32]> = Vec::new();
        let mut skip: Vec<u32> = Vec::new();
        let mut others = 0usize;
        for (key, members) in self.buckets() {
            // Rounding moves a bucket's cost a few ulps (1e-16 each), not 1e-12: the stop is exact.
            if best.is_some_and(|(c, _)| (base + key.term()) * (1.0 - 1e-12) > c) {
                break;
            }
            let holders: Vec<u32> = held
                .iter()
                .filter(|&(i, _)| self.key(i) == Some(*key))
                .map(|(i, _)| i as u32)
                .collect();
            let count = members.len() - holders.len();
            if count == 0 {
                continue;
            }
            let cost = warm_cost(kv, chain, 0, key.queued, key.in_flight, true);
            match best {
                Some((c, _)) if cost >= c => {}
                _ => {
                    best = Some((cost, 0));
                    tied.clear();
                    lists.clear();
                    skip.clear();
                    others = 0;
                }
            }
            if best == Some((cost, 0)) {
                lists.push(members);
                skip.extend(holders);
                others += count;
            }
        }
        let (_, m) = best?;
        if m > 0 {
            let k = nth_tied(tied.len(), rng);
            return tied.get(k).map(|&i| (m, i as usize));
        }
        skip.sort_unstable();
        kth_of(&lists, &skip, nth_tied(others, rng)).map(|i| (0, i as usize))
    }
}

/// [`Candidates::cheapest`]'s reference, and (at `u32::MAX`) the pick when every backend is full.
pub(crate) fn cheapest_scan(
    kv: &KvConfig,
    threshold: u32,
    chain: u32,
    matched: &[u32],
    loads: &[BackendLoad],
    homes: &[usize],
    rng: &mut dyn RngCore,
) -> Option<(u32, usize)> {
    let scored: Vec<(f64, u32, usize)> = loads
        .iter()
        .enumerate()
        .take(matched.len())
        .filter(|(_, l)| l.eligible && l.effective_in_flight() < threshold)
        .map(|(i, l)| {
            let at_home = homes.is_empty() || homes.contains(&i);
            let (m, queued, in_flight) = (
                matched[i],
                l.pending_prefill_blocks,
                l.effective_in_flight(),
            );
            (warm_cost(kv, chain, m, queued, in_flight, at_home), m, i)
        })
        .collect();
    let (c, m, _) = *scored
        .iter()
        .min_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)))?;
    let ties: Vec<usize> = scored
        .iter()
        .filter(|s| s.0 == c && s.1 == m)
        .map(|s| s.2)
        .collect();
    let k = nth_tied(ties.len(), rng);
    Some((m, ties[k]))
}

/// Which of `t` tied candidates wins: one uniform draw, none when there is no tie.
pub(crate) fn nth_tied(t: usize, rng: &mut dyn RngCore) -> usize {
    if t <= 1 {
        return 0;
    }
    ((u64::from(rng.next_u32()) * t as u64) >> 32) as usize
}

/// An rng salted with a decision count: draws differ even when it is seeded the same each time.
pub(crate) struct Salted<'a> {
    pub(crate) inner: &'a mut dyn RngCore,
    pub(crate) salt: u64,
}

impl RngCore for Salted<'_> {
    fn next_u64(&mut self) -> u64 {
        // splitmix64's finalizer over the mix, so nearby salts draw apart.
        let mut z = self.inner.next_u64() ^ self.salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for c in dst.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// The `k`-th smallest (from 0) of the sorted, disjoint `lists` less `skip` (sorted).
pub(crate) fn kth_of(lists: &[&[u32]], skip: &[u32], k: usize) -> Option<u32> {
    let count = |x: u32| -> usize {
        let inside: usize = lists.iter().map(|l| l.partition_point(|&p| p <= x)).sum();
        let skipped = skip.iter().take_while(|&&p| p <= x).count();
        inside - skipped.min(inside)
    };
    let hi = lists.iter().filter_map(|l| l.last()).copied().max()?;
    if count(hi) <= k {
        return None;
    }
    // The smallest x with more than k members at or below it is a member.
    let (mut lo, mut hi) = (0u32, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if count(mid) > k {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::test_util::idle;
    use crate::route::EngineLoad;
    use proptest::prelude::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn buckets_follow_load_changes() {
        let mut c = Candidates::new(4, 1.0, 2.0, 3);
        let mut loads = idle(4);
        c.sync(&loads, None);
        assert_eq!(c.buckets().count(), 1);
        assert!(c.any_eligible());
        loads[1].pending_prefill_blocks = 2; // term 2
        loads[2].in_flight = 1; // term 2 too, another bucket
        loads[3].in_flight = 3; // full
        c.sync(&loads, None);
        let got: Vec<(f64, Vec<u32>)> = c.buckets().map(|(k, v)| (k.term(), v.to_vec())).collect();
        assert_eq!(got, vec![(0.0, vec![0]), (2.0, vec![2]), (2.0, vec![1])]);
        assert!(!c.usable(3) && c.usable(2));
        loads[0].eligible = false;
        loads[1].eligible = false;
        loads[2].eligible = false;
        loads[3].eligible = false;
        c.sync(&loads, None);
        assert!(!c.any_eligible());
        assert_eq!(c.buckets().count(), 0);
    }

    /// A random load: (eligible, in flight, queued, engine's running).
    fn load() -> impl Strategy<Value = (bool, u32, u64, Option<u32>)> {
        (
            proptest::bool::weighted(0.9),
            0u32..7,
            prop_oneof![Just(0u64), 0u64..4, 0u64..300],
            prop_oneof![Just(None), (0u32..7).prop_map(Some)],
        )
    }

    fn loads_of(v: &[(bool, u32, u64, Option<u32>)]) -> Vec<BackendLoad> {
        v.iter()
            .map(|&(eligible, in_flight, queued, running)| BackendLoad {
                eligible,
                in_flight,
                pending_prefill_blocks: queued,
                engine: running.map(|running| EngineLoad {
                    running,
                    ..Default::default()
                }),
            })
            .collect()
    }

    fn weight() -> impl Strategy<Value = f64> {
        prop_oneof![Just(0.0), Just(1.0), Just(2.0), 0.0f64..3.0]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// On random fleets (loads changing between two syncs, random
        /// holders, homes and weights, many ties), the bucketed pick chooses
        /// exactly what the full scan does, and draws the same from `rng`.
        #[test]
        fn the_fast_pick_is_the_full_scan(
            n in 1usize..40,
            threshold in 1u32..6,
            chain in 1u32..64,
            before in proptest::collection::vec(load(), 40),
            now in proptest::collection::vec(load(), 40),
            held in proptest::collection::vec(prop_oneof![Just(0u32), Just(0u32), 1u32..80], 40),
            homes in proptest::collection::vec(0usize..40, 0..3),
            (pw, mw, dw) in (weight(), weight(), weight()),
            seed in any::<u64>(),
            extra in proptest::collection::vec(0usize..40, 0..6),
        ) {
            let kv = KvConfig {
                prefill_weight: pw,
                miss_weight: mw,
                decode_weight: dw,
                ..Default::default()
            };
            let now = loads_of(&now[..n]);
            let mut c = Candidates::new(n, pw, dw, threshold);
            let before = loads_of(&before[..n]);
            c.sync(&before, None);
            c.sync(&now, None);
            let matched = &held[..n];
            let h = Held(
                matched
                    .iter()
                    .enumerate()
                    .filter(|(_, &m)| m > 0)
                    .map(|(i, &m)| (i as u32, m))
                    .collect(),
            );
            let mut homes: Vec<usize> = homes.into_iter().filter(|&i| i < n).collect();
            homes.sort_unstable();
            homes.dedup();
            let mut fast_rng = SmallRng::seed_from_u64(seed);
            let mut scan_rng = SmallRng::seed_from_u64(seed);
            let fast = c.cheapest(&kv, chain, &h, &homes, &mut fast_rng);
            let scan = cheapest_scan(&kv, threshold, chain, matched, &now, &homes, &mut scan_rng);
            prop_assert_eq!(fast, scan);
            prop_assert_eq!(
                rand::RngCore::next_u64(&mut fast_rng),
                rand::RngCore::next_u64(&mut scan_rng)
            );
            // A fresh structure synced once agrees with the refiled one.
            let mut fresh = Candidates::new(n, pw, dw, threshold);
            fresh.sync(&now, None);
            let filed = |c: &Candidates| {
                let b: Vec<_> = c.buckets().map(|(k, v)| (*k, v.to_vec())).collect();
                (b, c.filed.clone(), c.flags.clone(), c.eligible)
            };
            prop_assert_eq!(filed(&fresh), filed(&c));
            // Told only the changed positions (and a few unchanged ones, a
            // superset), it files exactly what comparing every load does.
            let mut told = Candidates::new(n, pw, dw, threshold);
            told.sync(&before, None);
            let mut changed: Vec<usize> = (0..n).filter(|&i| before[i] != now[i]).collect();
            changed.extend(extra.into_iter().filter(|&i| i < n));
            told.sync(&now, Some(&changed));
            prop_assert_eq!(filed(&told), filed(&c));
        }

        /// `kth_of` is the k-th of the merged lists without the skipped.
        #[test]
        fn kth_is_the_merged_kth(
            members in proptest::collection::vec(0u8..4, 0..60),
            skip_mask in proptest::collection::vec(any::<bool>(), 60),
            k in 0usize..70,
        ) {
            // Position p goes to list members[p] (3: none).
            let mut lists = vec![Vec::new(); 3];
            for (p, &l) in members.iter().enumerate() {
                if l < 3 {
                    lists[l as usize].push(p as u32);
                }
            }
            let skip: Vec<u32> = (0..members.len() as u32)
                .filter(|&p| skip_mask[p as usize] && members[p as usize] < 3)
                .collect();
            let mut all: Vec<u32> = lists.concat();
            all.sort_unstable();
            all.retain(|p| !skip.contains(p));
            let refs: Vec<&[u32]> = lists.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(kth_of(&refs, &skip, k), all.get(k).copied());
        }
    }
}
