//! `kv_aware`'s state, under one lock taken once per decision, and cold
//! placement: where a prefix no backend holds goes (docs/kv.md).

use super::candidates::Candidates;
use super::fleet::Fleet;
use super::home::{Home, Homes};
use super::resident::Resident;
use super::ring::Ring;
use super::tuning::{home_table_keys, FIT_BAND, STICKY, TAIL_LOAD_MAX};
use crate::route::{BackendLoad, Mode, PolicyBackend};
use parking_lot::{Mutex, MutexGuard};
use std::cell::Cell;
use std::ops::{Deref, DerefMut};

/// How [`State::place`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Where the same prefix was placed moments ago (still prefilling).
    Remembered,
    /// The lowest cold cost, the ring's first usable backend too.
    RingOwner,
    Pressure,
}

/// Everything `kv_aware` learns, under one lock.
#[derive(Clone, Debug)]
pub(crate) struct State {
    /// Decayed blocks written per backend, in units of `unit`.
    pub(super) pressure: Vec<f64>,
    /// The weight of the next decision (growing by 1/decay decays every past one).
    pub(super) unit: f64,
    pub(super) seq: u64,
    pub(super) homes: Homes,
    /// Per decision: `1 - 1 / (window x backends)`.
    pub(super) decay: f64,
    pub(super) resident: Resident,
    /// The last admission threshold: (decision, prefix blocks, popularity).
    pub(super) tail: Cell<Option<(u64, u32, f64)>>,
    pub(super) cands: Candidates,
    pub(super) fleet: Cell<Option<Fleet>>,
    /// While a preview runs: what it puts back when it ends.
    pub(super) preview: Option<Box<Saved>>,
}

/// What a preview changes of the state before it decides, as it was.
#[derive(Clone, Debug)]
pub(crate) struct Saved {
    cands: Candidates,
    tail: Option<(u64, u32, f64)>,
    fleet: Option<Fleet>,
}

#[derive(Debug)]
pub(crate) struct Placer(Mutex<State>);

impl Placer {
    /// Decaying over `window` decisions per backend.
    pub(crate) fn new(backends: &[PolicyBackend], window: f64) -> Self {
        let n = backends.len().max(1);
        Placer(Mutex::new(State {
            pressure: vec![0.0; backends.len()],
            unit: 1.0,
            seq: 0,
            homes: Homes::new(backends.len(), home_table_keys(n)),
            decay: 1.0 - 1.0 / (window * n as f64).max(1.0),
            resident: Resident::new(backends.iter().map(|b| b.capacity_blocks)),
            tail: Cell::new(None),
            cands: Candidates::new(backends.len(), 0.0, 0.0, u32::MAX),
            fleet: Cell::new(None),
            preview: None,
        }))
    }

    /// The warm pick's candidates weigh loads by `kv` and treat `threshold` in flight as full.
    pub(crate) fn with_candidates(mut self, kv: &super::tuning::KvConfig, threshold: u32) -> Self {
        let s = self.0.get_mut();
        let n = s.pressure.len();
        s.cands = Candidates::new(n, kv.prefill_weight, kv.decode_weight, threshold);
        self
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock()
    }

    /// Under [`Mode::Preview`] commits do nothing and what is learnt is put back (docs/kv.md).
    pub(crate) fn state(&self, mode: Mode) -> Scope<'_> {
        let mut s = self.0.lock();
        if mode == Mode::Preview {
            s.preview = Some(Box::new(Saved {
                cands: s.cands.clone(),
                tail: s.tail.get(),
                fleet: s.fleet.get(),
            }));
            s.resident.begin();
        }
        Scope(s)
    }
}

/// See [`Placer::state`].
pub(crate) struct Scope<'a>(MutexGuard<'a, State>);

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        if let Some(saved) = self.0.preview.take() {
            let Saved { cands, tail, fleet } = *saved;
            self.0.cands = cands;
            self.0.tail.set(tail);
            self.0.fleet.set(fleet);
            self.0.resident.rollback();
        }
    }
}

impl Deref for Scope<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

impl DerefMut for Scope<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

impl State {
    #[cfg(test)]
    pub(crate) fn pressures(&self) -> Vec<f64> {
        self.pressure.iter().map(|p| p / self.unit).collect()
    }

    pub(crate) fn home(&self, key: u64) -> Option<Home> {
        self.homes.get(key)
    }

    /// Whether `home` is still followed: prefilling there, or homed within `STICKY` decisions.
    pub(crate) fn following(&self, home: &Home, loads: &[BackendLoad]) -> bool {
        let b = home.backend as usize;
        let prefilling = loads.get(b).is_some_and(|l| l.pending_prefill_blocks > 0);
        let since = u64::from((self.seq as u32).wrapping_sub(home.since));
        prefilling || since <= STICKY * self.pressure.len().max(1) as u64
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

    /// A request of `key`'s `blocks`-block chain, `m` held there, was sent to `backend`.
    pub(crate) fn sent(&mut self, key: u64, backend: usize, blocks: u32, m: u32) {
        if self.preview.is_some() {
            return;
        }
        self.record(key, backend, blocks.saturating_sub(m));
        self.cached(key, backend, blocks);
    }

    pub(crate) fn cached(&mut self, key: u64, backend: usize, blocks: u32) {
        if let Some(c) = self.resident.of_mut(backend) {
            c.store(key, u64::from(blocks));
        }
    }

    /// A fresh match: the model takes it, unless `key` follows its home `backend` (unpublished).
    pub(crate) fn observe(&mut self, key: u64, backend: usize, blocks: u32, loads: &[BackendLoad]) {
        let prefilling = self
            .homes
            .get(key)
            .is_some_and(|h| h.backend as usize == backend && self.following(&h, loads));
        if !prefilling {
            self.resident.observe(backend, key, u64::from(blocks));
        }
    }

    /// Homes `key` on `backend`; its popularity moves along.
    pub(crate) fn set_home(&mut self, key: u64, backend: usize) {
        if self.preview.is_some() {
            return;
        }
        self.homes.set_home(key, backend, self.seq);
        self.fleet.set(None);
    }

    /// A deliberate copy of `key` on `backend`, or the last one dropped (`None`).
    pub(crate) fn copy(&mut self, key: u64, backend: Option<usize>) {
        if self.preview.is_some() {
            return;
        }
        self.fleet.set(None);
        match backend {
            Some(b) => self.homes.add_copy(key, b),
            None => {
                self.homes.drop_copy(key);
            }
        }
    }

    /// Records a request of `key` sent to `backend`, which writes `blocks` into its cache.
    pub(crate) fn record(&mut self, key: u64, backend: usize, blocks: u32) {
        self.seq += 1;
        let unit = self.unit;
        if let Some(p) = self.pressure.get_mut(backend) {
            *p += unit * f64::from(blocks);
        }
        self.homes.hit(key, backend, unit, self.seq);
        self.unit /= self.decay;
        // Reset (everything divided by the unit) long before an f64 overflows.
        if self.unit > 1e200 {
            let k = self.unit;
            self.pressure.iter_mut().for_each(|p| *p /= k);
            self.homes.rescale(k);
            self.tail.set(None);
            self.unit = 1.0;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "place_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "place_scan_tests.rs"]
mod scan_tests;
