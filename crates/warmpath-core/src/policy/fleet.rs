//! The copy rule's fleet summary, reused for a few decisions so a large fleet
//! is not scanned per warm request (docs/kv.md, "Mechanisms").

use super::tuning::REUSE_BACKENDS;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Stamp {
    pub(crate) seq: u64,
    /// The decayed counters' unit: it grows every decision, so a rescale ends the summary.
    pub(crate) unit: f64,
    pub(crate) m: usize,
}

/// The usable backends' count and summed expected loads, reused for `n / REUSE_BACKENDS`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Fleet {
    taken: Stamp,
    pub(crate) count: u32,
    pub(crate) expected: f64,
}

impl Fleet {
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

    pub(crate) fn stands(&self, now: &Stamp, n: u64) -> bool {
        let reuse = (n / REUSE_BACKENDS).max(1);
        let t = &self.taken;
        now.unit >= t.unit
            && t.m == now.m
            && now.seq.saturating_sub(t.seq) < reuse
            && now.seq >= t.seq
    }
}
