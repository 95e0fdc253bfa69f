//! Where each recently seen prefix lives (its **home** backend), how popular
//! it is, and so what load each backend can expect.
//!
//! Why: below saturation `kv_aware` keeps a prefix where it is cached, so a
//! backend's share of the traffic is the sum of the popularities of the
//! prefixes homed on it. A decayed count of routed requests per backend
//! says where traffic *went*; it lags every change of placement and is
//! noisy while the caches fill. The sum over the prefixes homed on a backend
//! *now* is the load it will get next: when a prefix changes home, its whole
//! popularity moves with it at once. Cold placement ranks backends by it
//! (a prefix that comes back after an eviction brings its popularity along,
//! so placing it on the least expected load is LPT), and the rebalancer
//! ([`rebalance`](super::rebalance)) moves a prefix whose popularity fits the gap between
//! the most and the least loaded backend.
//!
//! What: a small set-associative table keyed by prefix key (`HOME_WAYS`; a full
//! set drops its least popular entry, whose popularity leaves its home's
//! load). Popularity is a decayed request count in the caller's units (see
//! `place::State`), so the loads' sum is the decayed count of requests whose
//! prefix is in the table, and every value is >= 0 up to rounding.

use super::tuning::{HOME_MIN_SETS, HOME_TABLE_KEYS, HOME_WAYS as WAYS};

/// What the table knows of one prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Home {
    /// The prefix key.
    pub(crate) key: u64,
    /// Where its requests go.
    pub(crate) backend: u32,
    /// Decayed requests of it, in the caller's units.
    pub(crate) pop: f64,
    /// The decision (sequence number) that placed or moved it here.
    pub(crate) since: u64,
    /// It came here by a rebalancing move (not a cold placement).
    pub(crate) moved: bool,
    /// Reserved here by a move's swap: its next cold request comes here.
    pub(crate) reserved: bool,
    used: bool,
}

/// Homes and expected loads (module docs).
#[derive(Debug)]
pub(crate) struct Homes {
    entries: Vec<Home>,
    /// Per backend: the sum of the popularity of the prefixes homed there.
    load: Vec<f64>,
}

impl Homes {
    /// For `backends` backends, room for about `keys` prefixes.
    pub(crate) fn new(backends: usize, keys: usize) -> Self {
        let sets = keys
            .div_ceil(WAYS)
            .clamp(HOME_MIN_SETS, HOME_TABLE_KEYS.1 / WAYS)
            .next_power_of_two();
        Homes {
            entries: vec![Home::default(); sets * WAYS],
            load: vec![0.0; backends],
        }
    }

    fn set(&self, key: u64) -> std::ops::Range<usize> {
        // The low bits pick the set; keys are hashes.
        let sets = self.entries.len() / WAYS;
        let at = (key as usize & (sets - 1)) * WAYS;
        at..at + WAYS
    }

    fn find(&self, key: u64) -> Option<usize> {
        self.set(key)
            .find(|&i| self.entries[i].used && self.entries[i].key == key)
    }

    /// The entry of `key`, if remembered.
    pub(crate) fn get(&self, key: u64) -> Option<Home> {
        self.find(key).map(|i| self.entries[i])
    }

    /// Expected load of each backend, in the caller's units.
    pub(crate) fn loads(&self) -> &[f64] {
        &self.load
    }

    /// One more request of `key` (weight `unit`): its popularity and its
    /// home's load grow. A key not in the table is homed on `backend`.
    pub(crate) fn hit(&mut self, key: u64, backend: usize, unit: f64, seq: u64) {
        let i = match self.find(key) {
            Some(i) => i,
            None => self.insert(key, backend, seq),
        };
        let e = &mut self.entries[i];
        e.pop += unit;
        if let Some(l) = self.load.get_mut(e.backend as usize) {
            *l += unit;
        }
    }

    /// Homes `key` on `backend` from decision `seq` (its popularity moves
    /// along); `moved` marks a rebalancing move.
    pub(crate) fn set_home(&mut self, key: u64, backend: usize, seq: u64, moved: bool) {
        let i = match self.find(key) {
            Some(i) => i,
            None => self.insert(key, backend, seq),
        };
        let e = self.entries[i];
        if e.backend as usize != backend {
            self.sub(e.backend as usize, e.pop);
            if let Some(l) = self.load.get_mut(backend) {
                *l += e.pop;
            }
        }
        self.entries[i] = Home {
            backend: backend as u32,
            since: seq,
            moved,
            reserved: false,
            ..e
        };
    }

    /// Homes `key` (already in the table) on `backend` for its next cold
    /// request only: a warm one goes where it is cached and re-homes it.
    pub(crate) fn reserve(&mut self, key: u64, backend: usize, seq: u64) {
        if self.find(key).is_some() {
            self.set_home(key, backend, seq, false);
            if let Some(i) = self.find(key) {
                self.entries[i].reserved = true;
            }
        }
    }

    /// The least popular prefix homed on `backend` other than `except`.
    pub(crate) fn least_popular(&self, backend: usize, except: u64) -> Option<u64> {
        self.entries
            .iter()
            .filter(|e| e.used && e.backend as usize == backend && e.key != except)
            .min_by(|a, b| a.pop.total_cmp(&b.pop))
            .map(|e| e.key)
    }

    /// A new entry for `key` on `backend`, in a free way of its set or in
    /// place of the set's least popular entry.
    fn insert(&mut self, key: u64, backend: usize, seq: u64) -> usize {
        let set = self.set(key);
        let i = set
            .clone()
            .find(|&i| !self.entries[i].used)
            .or_else(|| set.min_by(|&a, &b| self.entries[a].pop.total_cmp(&self.entries[b].pop)))
            .unwrap_or(0);
        let old = self.entries[i];
        if old.used {
            self.sub(old.backend as usize, old.pop);
        }
        self.entries[i] = Home {
            key,
            backend: backend as u32,
            pop: 0.0,
            since: seq,
            moved: false,
            reserved: false,
            used: true,
        };
        i
    }

    fn sub(&mut self, backend: usize, pop: f64) {
        if let Some(l) = self.load.get_mut(backend) {
            // Rounding must never leave a negative load.
            *l = (*l - pop).max(0.0);
        }
    }

    /// Divides every popularity and load by `k` (the caller's unit reset).
    pub(crate) fn rescale(&mut self, k: f64) {
        self.entries.iter_mut().for_each(|e| e.pop /= k);
        self.load.iter_mut().for_each(|l| *l /= k);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn popularity_follows_its_home() {
        let mut h = Homes::new(3, 16);
        for _ in 0..5 {
            h.hit(10, 0, 1.0, 1);
        }
        h.hit(11, 1, 1.0, 2);
        assert_eq!(h.loads(), &[5.0, 1.0, 0.0]);
        h.set_home(10, 2, 3, true);
        assert_eq!(h.loads(), &[0.0, 1.0, 5.0]);
        let e = h.get(10).unwrap();
        assert_eq!((e.backend, e.pop, e.since, e.moved), (2, 5.0, 3, true));
        // Later requests count where it lives now.
        h.hit(10, 0, 2.0, 4);
        assert_eq!(h.loads(), &[0.0, 1.0, 7.0]);
        h.rescale(2.0);
        assert_eq!(h.loads(), &[0.0, 0.5, 3.5]);
    }

    #[test]
    fn a_full_set_drops_its_least_popular_entry() {
        let mut h = Homes::new(2, 1);
        let sets = (h.entries.len() / WAYS) as u64;
        // Five keys of the same set, popularity 5, 4, 3, 2, 1 ...
        for (n, k) in (0..5u64).enumerate() {
            let key = 3 + k * sets;
            for _ in 0..(5 - n) {
                h.hit(key, n % 2, 1.0, 0);
            }
        }
        // ... the fifth (1 request) took the place of the fourth (2).
        assert!(h.get(3 + 3 * sets).is_none());
        assert_eq!(h.get(3 + 4 * sets).unwrap().pop, 1.0);
        // The fourth's 2 left backend 1's load (4 remain); backend 0 holds
        // 5 + 3 + 1.
        assert_eq!(h.loads(), &[9.0, 4.0]);
    }

    proptest! {
        /// Whatever the sequence, loads stay >= 0 and equal the sum of the
        /// remembered popularities homed on each backend.
        #[test]
        fn loads_are_the_sums_of_the_homed_popularities(
            ops in proptest::collection::vec((0u64..40, 0usize..4, any::<bool>(), 1u32..4), 1..300)
        ) {
            let mut h = Homes::new(4, 8);
            for (seq, &(key, backend, move_it, w)) in ops.iter().enumerate() {
                if move_it {
                    h.set_home(key, backend, seq as u64, true);
                } else {
                    h.hit(key, backend, f64::from(w), seq as u64);
                }
            }
            let mut sums = [0.0; 4];
            for e in h.entries.iter().filter(|e| e.used) {
                sums[e.backend as usize] += e.pop;
            }
            for (b, l) in h.loads().iter().enumerate() {
                prop_assert!(*l >= 0.0);
                prop_assert!((l - sums[b]).abs() < 1e-6, "{:?} {:?}", h.loads(), sums);
            }
        }
    }
}
