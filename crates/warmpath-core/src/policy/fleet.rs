//! What the copy rule ([`rebalance`](super::rebalance)) reads of the whole
//! fleet: the usable backends' count and their summed expected loads.
//!
//! Why a summary: the copy rule compares one prefix's popularity per
//! holder against the fleet's mean on every warm request at its home, a
//! pass over every backend. A summary is therefore reused for
//! `n / REUSE_BACKENDS` decisions (at least one) until a placement or copy
//! changes the homes (the state drops it then).

use super::tuning::REUSE_BACKENDS;

/// When a summary was taken: it is reused only under the same unit and
/// fleet size (a placement or copy drops it outright).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Stamp {
    /// The decision it was taken at.
    pub(crate) seq: u64,
    /// The decayed counters' unit then: it grows every decision, and a
    /// rescale sets it back, which ends the summary.
    pub(crate) unit: f64,
    /// The backends it covers, `0..m`.
    pub(crate) m: usize,
}

/// See the module docs. Loads are in the decayed counters' units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Fleet {
    taken: Stamp,
    /// Usable backends.
    pub(crate) count: u32,
    /// Their summed expected loads.
    pub(crate) expected: f64,
}

impl Fleet {
    /// One pass over the usable backends of `0..stamp.m`, `expected[b]`
    /// each one's expected load.
    pub(crate) fn scan(stamp: Stamp, usable: impl Fn(usize) -> bool, expected: &[f64]) -> Fleet {
        let mut f = Fleet {
            taken: stamp,
            count: 0,
            expected: 0.0,
        };
        for b in (0..stamp.m).filter(|&b| usable(b)) {
            f.count += 1;
            f.expected += expected.get(b).copied().unwrap_or(0.0);
        }
        f
    }

    /// Whether it still stands for `now` in a fleet of `n`: taken at the
    /// same size, with no rescale since, fewer than `n / REUSE_BACKENDS`
    /// decisions ago (only this decision's when that is at most 1).
    pub(crate) fn stands(&self, now: &Stamp, n: u64) -> bool {
        let reuse = (n / REUSE_BACKENDS).max(1);
        let t = &self.taken;
        now.unit >= t.unit
            && t.m == now.m
            && now.seq.saturating_sub(t.seq) < reuse
            && now.seq >= t.seq
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stamp(seq: u64, m: usize) -> Stamp {
        Stamp { seq, unit: 1.5, m }
    }

    #[test]
    fn it_is_reused_for_n_over_64_decisions_and_no_longer() {
        let loads = [4.0, 1.0, 3.0, 1.0];
        let f = Fleet::scan(stamp(10, 4), |_| true, &loads);
        // Up to 127 backends: this decision only.
        assert!(f.stands(&stamp(10, 4), 127));
        assert!(!f.stands(&stamp(11, 4), 127));
        // 1000 backends: 15 decisions.
        assert!(f.stands(&stamp(24, 4), 1000));
        assert!(!f.stands(&stamp(25, 4), 1000));
        // A rescale or another size: no.
        let rescaled = Stamp {
            unit: 1.0,
            ..stamp(10, 4)
        };
        assert!(!f.stands(&rescaled, 1000));
        let grown = Stamp {
            unit: 1.6,
            ..stamp(11, 4)
        };
        assert!(f.stands(&grown, 1000));
        assert!(!f.stands(&stamp(10, 3), 1000));
        // An older stamp than the summary (a reset): no.
        assert!(!f.stands(&stamp(9, 4), 1000));
    }

    proptest! {
        /// The summary is the plain pass: the count and the sums.
        #[test]
        fn the_summary_is_the_scan(
            fleet in proptest::collection::vec((0u8..6, any::<bool>()), 0..24),
        ) {
            let loads: Vec<f64> = fleet.iter().map(|&(l, _)| f64::from(l)).collect();
            let usable = |b: usize| fleet[b].1;
            let f = Fleet::scan(stamp(0, fleet.len()), usable, &loads);
            let ok: Vec<usize> = (0..fleet.len()).filter(|&b| usable(b)).collect();
            prop_assert_eq!(f.count as usize, ok.len());
            prop_assert_eq!(f.expected, ok.iter().map(|&b| loads[b]).sum::<f64>());
        }
    }
}
