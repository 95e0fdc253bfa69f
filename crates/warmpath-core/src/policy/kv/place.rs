//! The `place` stage: where a prefix no eligible backend holds goes (docs/kv.md), read
//! off the [`State`].

use super::tuning::{FIT_BAND, TAIL_LOAD_MAX};
use super::{step, KvAware, Rehome, State, Step};
use crate::error::PolicyError;
use crate::policy::ring::Ring;
use crate::route::{least_loaded, BackendLoad, DecisionKind, RouteInput};
use rand::RngCore;

/// How [`State::place`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Where the same prefix was placed moments ago (still prefilling).
    Remembered,
    /// The lowest cold cost, the ring's first usable backend too.
    RingOwner,
    Pressure,
}

/// A cold prefix's step: placed by [`State::place`] among the usable backends, or, with every
/// backend full, the same placement with the gate lifted; it is homed where it goes.
pub(super) fn cold(
    p: &KvAware,
    s: &State,
    input: &RouteInput<'_>,
    loads: &[BackendLoad],
    rng: &mut dyn RngCore,
) -> Result<Step, PolicyError> {
    let (key, blocks) = (input.prefix_key, input.chain_blocks);
    let (ring, weights, band) = (&p.ring, p.weights(), f64::from(blocks));
    let kind = |how| match how {
        Placed::Pressure => DecisionKind::Cold,
        Placed::RingOwner | Placed::Remembered => DecisionKind::PrefixHash,
    };
    let eligible = |i: usize| loads.get(i).is_some_and(|l| l.eligible);
    let usable = |i: usize| s.cands.usable(i);
    let (backend, kind) =
        if let Some((b, how)) = s.place(key, blocks, loads, usable, ring, weights, band) {
            (b, kind(how))
        } else if let Some((b, how)) = s.place(key, blocks, loads, eligible, ring, weights, band) {
            (b, least_or(loads, b, kind(how)))
        } else {
            let b = least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?;
            (b, DecisionKind::LeastOutstanding)
        };
    Ok(step(backend, 0, kind, Rehome::To(backend)))
}

/// `kind`, or `least_outstanding` when (every backend full) the pick has the fewest in flight.
pub(super) fn least_or(loads: &[BackendLoad], backend: usize, kind: DecisionKind) -> DecisionKind {
    let min = loads
        .iter()
        .filter(|l| l.eligible)
        .map(BackendLoad::effective_in_flight)
        .min();
    let least = loads
        .get(backend)
        .is_some_and(|l| Some(l.effective_in_flight()) == min);
    if least {
        DecisionKind::LeastOutstanding
    } else {
        kind
    }
}

impl State {
    #[cfg(test)]
    pub(crate) fn pressures(&self) -> Vec<f64> {
        self.pressure.iter().map(|p| p / self.unit).collect()
    }

    /// Where a prefix no eligible backend holds goes; `weights` are (prefill, miss, decode).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn place(
        &self,
        key: u64,
        blocks: u32,
        loads: &[BackendLoad],
        usable: impl Fn(usize) -> bool,
        ring: &Ring,
        weights: (f64, f64, f64),
        band: f64,
    ) -> Option<(usize, Placed)> {
        if let Some(h) = self.homes.get(key) {
            if usable(h.backend as usize) && self.following(&h, loads) {
                return Some((h.backend as usize, Placed::Remembered));
            }
        }
        let (prefill_weight, miss_weight, decode_weight) = weights;
        let n = loads.len().min(self.pressure.len());
        let px = self.popularity_with(key);
        // A tail prefix pays no turnover term: it churns where the cache turns over fastest.
        let tail = px < self.tail_threshold(blocks);
        let modelled = self.resident.any();
        let scored: Vec<(usize, f64, f64)> = (0..n)
            .filter(|&b| usable(b))
            .map(|b| {
                let evict = if modelled {
                    let lost = if tail {
                        0.0
                    } else {
                        self.lost_at(b, px, blocks)
                    };
                    self.evict_at(b, px, key, blocks) + lost
                } else {
                    0.0
                };
                // Where the capacity is known the eviction term replaces pressure, its proxy.
                let write = match self.resident.of(b) {
                    Some(_) => evict,
                    None => self.pressure[b] / self.unit,
                };
                let l = &loads[b];
                let cost = miss_weight * write
                    + prefill_weight * l.pending_prefill_blocks as f64
                    + decode_weight * f64::from(l.effective_in_flight());
                (b, cost, evict)
            })
            .collect();
        let min = scored.iter().map(|s| s.1).min_by(f64::total_cmp)?;
        // Never even loads at the price of evicting hotter prefixes (`FIT_BAND`).
        let least_loss = scored.iter().map(|s| s.2).min_by(f64::total_cmp)?;
        let fit_band = FIT_BAND * f64::from(blocks);
        let good = |s: &(usize, f64, f64)| s.1 <= min + band && s.2 <= least_loss + fit_band;
        let expected = self.homes.loads();
        // The tail concentrates where the cache writes most, on backends not far above the mean.
        let mean = scored.iter().map(|s| expected[s.0]).sum::<f64>() / scored.len().max(1) as f64;
        let light = |b: usize| expected[b] <= TAIL_LOAD_MAX * mean;
        let tail = tail && scored.iter().any(|s| good(s) && light(s.0));
        let good = |s: &(usize, f64, f64)| good(s) && (!tail || light(s.0));
        let rank = |b: usize| {
            if tail {
                -self.pressure[b]
            } else {
                expected[b]
            }
        };
        let least = scored
            .iter()
            .filter(|s| good(s))
            .map(|s| rank(s.0))
            .min_by(f64::total_cmp)?;
        let mut tied = scored.iter().filter(|s| good(s) && rank(s.0) <= least);
        let first = tied.next()?.0;
        // Exact ties (an idle fleet) go by the ring; one winner needs no walk.
        let at = if tied.next().is_none() {
            first
        } else {
            let is_tied = |b: usize| {
                scored
                    .binary_search_by_key(&b, |s| s.0)
                    .is_ok_and(|i| good(&scored[i]) && rank(b) <= least)
            };
            ring.walk(key).find(|&b| is_tied(b))?
        };
        let owner = ring.walk(key).find(|&b| b < n && usable(b));
        let how = if owner == Some(at) {
            Placed::RingOwner
        } else {
            Placed::Pressure
        };
        Some((at, how))
    }

    #[cfg(test)]
    pub(crate) fn evict_cost(&self, b: usize, key: u64, blocks: u32) -> f64 {
        let px = self.popularity_with(key);
        self.evict_at(b, px, key, blocks)
    }

    /// The eviction term: each victim's trimmed blocks × `p_v / (p_v + p_x)`; a stale copy is free.
    fn evict_at(&self, b: usize, px: f64, key: u64, blocks: u32) -> f64 {
        let Some(cache) = self.resident.of(b) else {
            return 0.0;
        };
        // Room for the whole chain: no victims, and no LRU walk.
        if cache.has_room(u64::from(blocks)) {
            return std::iter::empty::<f64>().sum();
        }
        cache
            .victims(key, u64::from(blocks))
            .map(|(v, trim)| {
                let pv = self
                    .homes
                    .get(v)
                    .filter(|h| self.homes.holds(h, b))
                    .map_or(0.0, |h| h.pop);
                trim as f64 * pv / (pv + px)
            })
            .sum()
    }

    /// `p_x`: `key`'s popularity with the request being placed counted.
    fn popularity_with(&self, key: u64) -> f64 {
        self.homes.get(key).map_or(0.0, |h| h.pop) + self.unit
    }

    #[cfg(test)]
    fn lost_cost(&self, b: usize, key: u64, blocks: u32) -> f64 {
        let px = self.popularity_with(key);
        self.lost_at(b, px, blocks)
    }

    /// The turnover term `blocks * exp(-p_x * C_b / P_b)`: what `b`'s LRU trims before it returns.
    fn lost_at(&self, b: usize, px: f64, blocks: u32) -> f64 {
        let Some(cache) = self.resident.of(b) else {
            return 0.0;
        };
        let stays = px * cache.capacity() as f64 / self.pressure[b].max(f64::MIN_POSITIVE);
        f64::from(blocks) * (-stays).exp()
    }

    /// The admission threshold (0 when all fit); a select over the table, so cached `n` decisions.
    pub(crate) fn tail_threshold(&self, blocks: u32) -> f64 {
        let n = self.pressure.len().max(1) as u64;
        let fresh = |&(at, b, _): &(u64, u32, f64)| b == blocks && self.seq.saturating_sub(at) < n;
        if let Some((_, _, t)) = self.tail.get().filter(fresh) {
            return t;
        }
        let (total, largest) = self.resident.capacity();
        let room = total.saturating_sub(largest);
        let k = (room / u64::from(blocks.max(1))) as usize;
        let mut pops: Vec<f64> = self.homes.pops().filter(|&p| p > 0.0).collect();
        let t = if k == 0 || pops.len() <= k {
            0.0
        } else {
            *pops.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a)).1
        };
        self.tail.set(Some((self.seq, blocks, t)));
        t
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "place_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "place_scan_tests.rs"]
mod scan_tests;
