//! What the balance stage (moves and copies, [`rebalance`](super::rebalance))
//! reads of the whole fleet: the usable backends' count, their summed
//! expected loads, and the two lowest.
//!
//! Why a summary: the move and copy rules compare one home against the
//! fleet's mean, and the move rule needs the least loaded backend; each is a
//! pass over every backend. With moves at most `2 x 64` decisions apart, the
//! move check passed its waits on nearly every warm request, and at 1000
//! backends that pass cost about 3 µs of a decision (BENCHMARKS.md). A
//! summary is therefore reused for `n / REUSE_BACKENDS` decisions (at
//! least one) until a placement, move or copy changes the homes (the
//! state drops it then): fleets of up to 127 backends take a new one every
//! decision, so their rules read exact loads;
//! a larger fleet's mean moves by about `1 / (PRESSURE_WINDOW x 64)` of
//! itself in that time, and the move target's own load is read afresh.

/// The fleet size per decision a summary is reused for: `n / 64`.
const REUSE_BACKENDS: u64 = 64;

/// When a summary was taken: it is reused only under the same unit and
/// fleet size (a placement, move or copy drops it outright).
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
    /// The lowest expected load and the lowest of the others (ties: the
    /// lower position), as (backend, load).
    low: [Option<(usize, f64)>; 2],
}

impl Fleet {
    /// One pass over the usable backends of `0..stamp.m`, `expected[b]`
    /// each one's expected load.
    pub(crate) fn scan(stamp: Stamp, usable: impl Fn(usize) -> bool, expected: &[f64]) -> Fleet {
        let mut f = Fleet {
            taken: stamp,
            count: 0,
            expected: 0.0,
            low: [None, None],
        };
        for b in (0..stamp.m).filter(|&b| usable(b)) {
            let l = expected.get(b).copied().unwrap_or(0.0);
            f.count += 1;
            f.expected += l;
            match f.low {
                [Some((_, lo)), _] if l >= lo => {
                    if f.low[1].is_none_or(|(_, lo2)| l < lo2) {
                        f.low[1] = Some((b, l));
                    }
                }
                [first, _] => f.low = [Some((b, l)), first],
            }
        }
        f
    }

    /// Whether it still stands for `now` in a fleet of `n`: taken at the
    /// same size, with no rescale since, fewer than `n / REUSE_BACKENDS`
    /// decisions ago (only this decision's when that is at most 1), and its
    /// lowest backends still usable.
    pub(crate) fn stands(&self, now: &Stamp, n: u64, usable: impl Fn(usize) -> bool) -> bool {
        let reuse = (n / REUSE_BACKENDS).max(1);
        let t = &self.taken;
        now.unit >= t.unit
            && t.m == now.m
            && now.seq.saturating_sub(t.seq) < reuse
            && now.seq >= t.seq
            && self.low.iter().flatten().all(|&(b, _)| usable(b))
    }

    /// The usable backend with the lowest expected load other than `but`.
    pub(crate) fn lowest_but(&self, but: usize) -> Option<usize> {
        self.low
            .iter()
            .flatten()
            .map(|&(b, _)| b)
            .find(|&b| b != but)
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
        let all = |_| true;
        // Up to 127 backends: this decision only.
        assert!(f.stands(&stamp(10, 4), 127, all));
        assert!(!f.stands(&stamp(11, 4), 127, all));
        // 1000 backends: 15 decisions.
        assert!(f.stands(&stamp(24, 4), 1000, all));
        assert!(!f.stands(&stamp(25, 4), 1000, all));
        // A rescale, another size or an unusable low backend: no.
        let rescaled = Stamp {
            unit: 1.0,
            ..stamp(10, 4)
        };
        assert!(!f.stands(&rescaled, 1000, all));
        let grown = Stamp {
            unit: 1.6,
            ..stamp(11, 4)
        };
        assert!(f.stands(&grown, 1000, all));
        assert!(!f.stands(&stamp(10, 3), 1000, all));
        assert!(!f.stands(&stamp(10, 4), 1000, |b| b != 3));
        // An older stamp than the summary (a reset): no.
        assert!(!f.stands(&stamp(9, 4), 1000, all));
    }

    proptest! {
        /// The summary is the plain pass: the count, the sums, and for every
        /// backend the lowest other usable one, first by position on ties.
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
            for but in 0..fleet.len() {
                let mut want: Option<(usize, f64)> = None;
                for &b in ok.iter().filter(|&&b| b != but) {
                    if want.is_none_or(|(_, lo)| loads[b] < lo) {
                        want = Some((b, loads[b]));
                    }
                }
                prop_assert_eq!(f.lowest_but(but), want.map(|w| w.0));
            }
        }
    }
}
