//! The payback part of `kv_aware`'s balance load: what each backend was
//! actually sent, so that an excess it already took is paid back.
//!
//! Why: the rebalancer ([`rebalance`](super::rebalance)) evens the
//! *expected* loads (the popularity of the prefixes homed on each backend).
//! That steers the traffic to come, never the traffic that went: a backend
//! that ran hot while the caches filled (before any popularity was known)
//! keeps its excess for good, and one that sits just under the move trigger
//! (`kv.rebalance_slack` above the mean) runs that much hot for as long as it
//! stays there. A share of the requests counted over a run is then uneven by
//! about the slack.
//!
//! What: a decayed count of the requests routed to each backend over about
//! `PAYBACK_WINDOW` decisions per backend (longer than a benchmark run). Its
//! excess over the mean (requests a backend took beyond an even share) is
//! added, times `PAYBACK_GAIN` and capped at the mean expected load, to the
//! expected load the rebalancer evens. Both are in the same units: the
//! expected loads sum to about the requests of the last `PRESSURE_WINDOW` decisions per
//! backend, so at a payback of 1 an excess of `x` requests weighs as much as
//! a prefix that brings `x` requests per such window: the excess is paid
//! back over about one window (the default 2: half a window). It is an
//! integral term: the expected loads alone leave a steady error (up to the
//! slack); the excess grows while that error lasts, until a move is worth it.

use super::tuning::RESCALE_AT;

/// Decayed requests routed per backend (module docs).
#[derive(Clone, Debug)]
pub(crate) struct Served {
    /// Per backend, in units of `unit`.
    counts: Vec<f64>,
    /// Their sum, in units of `unit`.
    total: f64,
    /// The weight of the next request (grows by 1/decay per request, the
    /// same as decaying every past one).
    unit: f64,
    decay: f64,
}

impl Served {
    /// Over `backends` backends, remembering about `window` requests.
    pub(crate) fn new(backends: usize, window: f64) -> Self {
        Served {
            counts: vec![0.0; backends],
            total: 0.0,
            unit: 1.0,
            decay: 1.0 - 1.0 / window.max(1.0),
        }
    }

    /// One request routed to `backend`.
    pub(crate) fn record(&mut self, backend: usize) {
        if let Some(c) = self.counts.get_mut(backend) {
            *c += self.unit;
            self.total += self.unit;
        }
        self.unit /= self.decay;
        if self.unit > RESCALE_AT {
            let k = self.unit;
            self.counts.iter_mut().for_each(|c| *c /= k);
            self.total /= k;
            self.unit = 1.0;
        }
    }

    /// These counts over a new membership: `from[j]` is the old position of
    /// the new snapshot's backend `j` (`None`: new, counted from zero, so it
    /// starts below an even share), remembering about `window` requests.
    pub(crate) fn remap(&self, from: &[Option<usize>], window: f64) -> Self {
        let counts: Vec<f64> = from
            .iter()
            .map(|f| f.and_then(|i| self.counts.get(i)).copied().unwrap_or(0.0))
            .collect();
        Served {
            total: counts.iter().sum(),
            counts,
            unit: self.unit,
            decay: 1.0 - 1.0 / window.max(1.0),
        }
    }

    /// Requests `backend` took beyond an even share of the remembered ones
    /// (negative: fewer), in requests.
    pub(crate) fn excess(&self, backend: usize) -> f64 {
        let n = self.counts.len().max(1) as f64;
        self.counts
            .get(backend)
            .map_or(0.0, |c| (c - self.total / n) / self.unit)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn excess_is_against_an_even_share_and_decays() {
        let mut s = Served::new(3, 1e9);
        for b in [0, 0, 0, 1, 1, 2] {
            s.record(b);
        }
        let x: Vec<f64> = (0..3).map(|b| s.excess(b)).collect();
        for (got, want) in x.iter().zip([1.0, 0.0, -1.0]) {
            assert!((got - want).abs() < 1e-6, "{x:?}");
        }
        // A short memory forgets the early excess.
        let mut s = Served::new(2, 10.0);
        for _ in 0..20 {
            s.record(0);
        }
        let early = s.excess(0);
        for b in (0..200).map(|i| i % 2) {
            s.record(b);
        }
        // (Alternating leaves at most half a request between the two.)
        assert!(early > 3.0, "{early}");
        assert!(s.excess(0).abs() < 0.5, "{}", s.excess(0));
        // Out-of-range backends count for nothing.
        s.record(9);
        assert_eq!(s.excess(9), 0.0);
    }

    #[test]
    fn a_remap_keeps_the_counts_by_worker_and_starts_a_new_one_at_zero() {
        let mut s = Served::new(3, 1e9);
        for b in [0, 0, 0, 1, 2, 2] {
            s.record(b);
        }
        // Backend 1 removed, a new one appended.
        let t = s.remap(&[Some(0), Some(2), None], 1e9);
        let x: Vec<f64> = (0..3).map(|b| t.excess(b)).collect();
        for (got, want) in x.iter().zip([4.0 / 3.0, 1.0 / 3.0, -5.0 / 3.0]) {
            assert!((got - want).abs() < 1e-6, "{x:?}");
        }
    }

    proptest! {
        /// The excesses sum to zero and stay within the requests remembered.
        #[test]
        fn excesses_sum_to_zero(
            picks in proptest::collection::vec(0usize..4, 1..500),
            window in 1.0f64..1000.0,
        ) {
            let mut s = Served::new(4, window);
            for &b in &picks {
                s.record(b);
            }
            let sum: f64 = (0..4).map(|b| s.excess(b)).sum();
            prop_assert!(sum.abs() < 1e-6 * picks.len() as f64, "{sum}");
            for b in 0..4 {
                prop_assert!(s.excess(b).abs() <= picks.len() as f64 + 1e-6);
            }
        }
    }
}
