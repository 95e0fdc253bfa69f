//! Where `kv_aware` puts a prefix that no backend holds (`kv.cold_placement =
//! pressure`, the default), and the memory that keeps it there while its
//! first request is still prefilling.
//!
//! Why: the hash ring places prefixes by hash alone, so the number of
//! distinct prefixes per backend varies like a random throw (112 documents
//! on 7 backends: 9 to 23 in a typical placement). A backend given more than
//! its cache holds evicts them in turn and misses on every return, while
//! another has room to spare; and in-flight bounds never bind below
//! saturation, so the ring is all that decides.
//!
//! What: each backend has a **cache pressure**, the blocks `kv_aware` sent
//! it that it did not hold (a cold prefix's whole chain, a warm request's
//! uncached tail), decayed over about `pressure_window` decisions per
//! backend. That is what it had to write into its cache lately, so a prefix
//! placed on the backend with the least pressure lands where the cache
//! turns over slowest; it also spreads the prefixes' count evenly while the
//! cache fills. The cold cost of backend `w` is
//!
//! ```text
//! pressure_w + prefill_weight * pending_prefill_blocks_w + decode_weight * in_flight_w
//! ```
//!
//! (queued prefill work is charged so a cold prefill does not queue behind
//! another one). Every backend within `placement_tolerance` x the prefix's
//! own blocks of the lowest cost counts as equally good, and among those the
//! one with the lowest recent share of requests (decayed like the pressure)
//! wins: while prefixes arrive roughly in popularity order (a popular one is
//! seen first), that deals them out like a snake draft, so the backends end
//! up with about as many prefixes *and* as much traffic each. Remaining ties
//! go to the first in the ring's walk from the prefix key, so equal fleets
//! agree. A placement is remembered by
//! prefix key in a small direct-mapped table: a request for the same key
//! that finds no fresh match while the first is still prefilling there (or
//! within a few decisions per backend of it, before its blocks are
//! published) follows it instead of starting a second cold copy elsewhere.

use super::ring::Ring;
use super::{BackendLoad, PolicyBackend};
use parking_lot::Mutex;

/// How [`Placer::place`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Where the same prefix was placed moments ago (still prefilling).
    Remembered,
    /// The lowest cold cost, and the ring's first usable backend too.
    RingOwner,
    /// The lowest cold cost, passing the ring's choice over.
    Pressure,
}

/// One remembered placement.
#[derive(Clone, Copy, Debug, Default)]
struct Recent {
    key: u64,
    backend: u32,
    seq: u64,
    used: bool,
}

#[derive(Debug)]
struct State {
    /// Decayed blocks written per backend, in units of `unit`.
    pressure: Vec<f64>,
    /// Decayed requests routed per backend, in units of `unit`.
    routed: Vec<f64>,
    /// The weight of the next decision (grows by 1/decay per decision, the
    /// same as decaying every past one).
    unit: f64,
    /// Decisions so far.
    seq: u64,
    recent: Vec<Recent>,
}

/// Cache pressure per backend and the recent-placement memory.
#[derive(Debug)]
pub(crate) struct Placer {
    decay: f64,
    /// Decisions a placement stays sticky without pending prefill work.
    sticky: u64,
    state: Mutex<State>,
}

impl Placer {
    /// Over `backends`, remembering about `window` decisions per backend.
    pub(crate) fn new(backends: &[PolicyBackend], window: f64) -> Self {
        let n = backends.len().max(1);
        let slots = (64 * n).clamp(1024, 1 << 20).next_power_of_two();
        Placer {
            decay: 1.0 - 1.0 / (window * n as f64).max(1.0),
            sticky: 4 * n as u64,
            state: Mutex::new(State {
                pressure: vec![0.0; backends.len()],
                routed: vec![0.0; backends.len()],
                unit: 1.0,
                seq: 0,
                recent: vec![Recent::default(); slots],
            }),
        }
    }

    /// Each backend's decayed pressure now, in blocks (for tests).
    #[cfg(test)]
    pub(crate) fn pressures(&self) -> Vec<f64> {
        let s = self.state.lock();
        s.pressure.iter().map(|p| p / s.unit).collect()
    }

    /// The backend to place a prefix no eligible backend holds, among those
    /// `usable`: the remembered placement of `key` when it is still
    /// prefilling or recent, else the lowest recent share among those within
    /// `tolerance` blocks of the lowest cold cost (module docs), ties by
    /// `ring` order from `key`. `weights` are (prefill, decode).
    pub(crate) fn place(
        &self,
        key: u64,
        loads: &[BackendLoad],
        usable: impl Fn(usize) -> bool,
        ring: &Ring,
        weights: (f64, f64),
        tolerance: f64,
    ) -> Option<(usize, Placed)> {
        let s = self.state.lock();
        let r = s.recent[key as usize & (s.recent.len() - 1)];
        if r.used && r.key == key {
            let b = r.backend as usize;
            let prefilling = loads.get(b).is_some_and(|l| l.pending_prefill_blocks > 0);
            if usable(b) && (prefilling || s.seq.saturating_sub(r.seq) <= self.sticky) {
                return Some((b, Placed::Remembered));
            }
        }
        let (prefill_weight, decode_weight) = weights;
        let n = loads.len().min(s.pressure.len());
        let cost = |b: usize| {
            let l = &loads[b];
            s.pressure[b] / s.unit
                + prefill_weight * l.pending_prefill_blocks as f64
                + decode_weight * f64::from(l.effective_in_flight())
        };
        let min = (0..n)
            .filter(|&b| usable(b))
            .map(cost)
            .min_by(f64::total_cmp)?;
        let good = |b: usize| b < n && usable(b) && cost(b) <= min + tolerance;
        let least = (0..n)
            .filter(|&b| good(b))
            .map(|b| s.routed[b])
            .min_by(f64::total_cmp)?;
        // Exact ties (an idle fleet) go by the ring, so the walk is short:
        // it stops at the first tied backend.
        let at = ring.walk(key).find(|&b| good(b) && s.routed[b] <= least)?;
        let owner = ring.walk(key).find(|&b| b < n && usable(b));
        let how = if owner == Some(at) {
            Placed::RingOwner
        } else {
            Placed::Pressure
        };
        Some((at, how))
    }

    /// Records a decision: `blocks` written into `backend`'s cache, and,
    /// when `placed` (a cold placement), `key` remembered there. Taken
    /// under its own lock after [`place`](Self::place): two routing threads
    /// placing at once may both see the same pressures (a hint, not a
    /// reservation; the next decision sees both).
    pub(crate) fn record(&self, key: u64, backend: usize, blocks: u32, placed: bool) {
        let mut s = self.state.lock();
        s.seq += 1;
        if placed {
            let seq = s.seq;
            let len = s.recent.len();
            s.recent[key as usize & (len - 1)] = Recent {
                key,
                backend: backend as u32,
                seq,
                used: true,
            };
        }
        let unit = s.unit;
        if let Some(p) = s.pressure.get_mut(backend) {
            *p += unit * f64::from(blocks);
        }
        if let Some(r) = s.routed.get_mut(backend) {
            *r += unit;
        }
        s.unit /= self.decay;
        if s.unit > 1e200 {
            let k = s.unit;
            s.pressure.iter_mut().for_each(|p| *p /= k);
            s.routed.iter_mut().for_each(|r| *r /= k);
            s.unit = 1.0;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::test_util::*;

    #[test]
    fn pressure_decays_and_spreads_new_prefixes() {
        let b = backends(4);
        let ring = Ring::new(&b, 160);
        let p = Placer::new(&b, 100.0);
        let loads = idle(4);
        let mut placed = [0u32; 4];
        // 40 distinct cold prefixes of 500 blocks: 10 on each backend.
        for key in 0..40u64 {
            let key = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let (at, _) = p
                .place(key, &loads, |_| true, &ring, (0.0, 0.0), 0.0)
                .unwrap();
            p.record(key, at, 500, true);
            placed[at] += 1;
        }
        assert_eq!(placed, [10; 4]);
        let before = p.pressures();
        for _ in 0..400 {
            p.record(1, 0, 0, false);
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
        let p = Placer::new(&b, 100.0);
        let mut loads = idle(3);
        let (first, _) = p
            .place(42, &loads, |_| true, &ring, (1.0, 2.0), 0.0)
            .unwrap();
        p.record(42, first, 500, true);
        loads[first].pending_prefill_blocks = 500;
        // Its pressure and queue now make it the costliest, yet the same key
        // follows it.
        assert_eq!(
            p.place(42, &loads, |_| true, &ring, (1.0, 2.0), 0.0),
            Some((first, Placed::Remembered))
        );
        // Another key does not.
        let (other, _) = p
            .place(43, &loads, |_| true, &ring, (1.0, 2.0), 0.0)
            .unwrap();
        assert_ne!(other, first);
        p.record(43, other, 500, true);
        // Done prefilling and many decisions later: placed afresh.
        loads[first].pending_prefill_blocks = 0;
        for _ in 0..100 {
            p.record(7, other, 0, false);
        }
        let (again, how) = p
            .place(42, &loads, |_| true, &ring, (1.0, 2.0), 0.0)
            .unwrap();
        assert_ne!(how, Placed::Remembered);
        // The least pressure: neither the first (500 blocks) nor `other`.
        assert!(again != first && again != other, "{again}");
        // An unusable remembered backend is never returned.
        loads[first].pending_prefill_blocks = 500;
        p.record(42, first, 500, true);
        let (b2, _) = p
            .place(42, &loads, |i| i != first, &ring, (1.0, 2.0), 0.0)
            .unwrap();
        assert_ne!(b2, first);
        assert_eq!(p.place(42, &loads, |_| false, &ring, (1.0, 2.0), 0.0), None);
    }

    #[test]
    fn within_the_tolerance_the_least_requested_backend_wins() {
        let b = backends(3);
        let ring = Ring::new(&b, 160);
        let p = Placer::new(&b, 100.0);
        let loads = idle(3);
        let w = (1.0, 2.0);
        // One 500-block prefix each; then backend 1 serves 30 full hits
        // (nothing written) and backend 2 five requests writing 20 blocks:
        // 1 has the lower pressure, 2 the lower share of requests.
        for (key, at) in [(1u64, 0usize), (2, 1), (3, 2)] {
            p.record(key, at, 500, true);
        }
        for _ in 0..30 {
            p.record(2, 1, 0, false);
        }
        for _ in 0..5 {
            p.record(3, 2, 20, false);
        }
        let pick = |usable: &dyn Fn(usize) -> bool, loads: &[BackendLoad], tol| {
            p.place(9, loads, usable, &ring, w, tol).unwrap().0
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
}
