//! Where a decision's routing time goes: hashing, index match and pick, the
//! last two also by decision kind.

use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The mean routing time per decision, by part, µs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RoutingCost {
    /// Hashing the chain (about 0 for strategies that do not read the index).
    pub hash_us: f64,
    /// `CacheIndex::longest_match` (about 0 likewise).
    pub match_us: f64,
    /// Everything after the match: the load view and the policy's pick.
    pub pick_us: f64,
    /// Per decision kind (`cold`, `kv_match`, ...).
    pub by_kind: BTreeMap<String, KindCost>,
}

/// The decisions of one kind and their mean match and pick times, µs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KindCost {
    pub decisions: u64,
    /// Mean index match per decision, µs.
    pub match_us: f64,
    /// Mean pick (everything after the match) per decision, µs.
    pub pick_us: f64,
}

#[derive(Debug, Default)]
pub(super) struct CostSums {
    decisions: u64,
    hash: Duration,
    matching: Duration,
    pick: Duration,
    by_kind: BTreeMap<&'static str, (u64, Duration, Duration)>,
}

impl CostSums {
    /// One decision of `kind` and its three parts.
    pub(super) fn add(
        &mut self,
        kind: &'static str,
        hash: Duration,
        matching: Duration,
        pick: Duration,
    ) {
        self.decisions += 1;
        self.hash += hash;
        self.matching += matching;
        self.pick += pick;
        let k = self.by_kind.entry(kind).or_default();
        k.0 += 1;
        k.1 += matching;
        k.2 += pick;
    }

    pub(super) fn report(&self) -> RoutingCost {
        let mean = |d: Duration, n: u64| crate::stats::ratio(d.as_secs_f64() * 1e6, n as f64);
        RoutingCost {
            hash_us: mean(self.hash, self.decisions),
            match_us: mean(self.matching, self.decisions),
            pick_us: mean(self.pick, self.decisions),
            by_kind: self
                .by_kind
                .iter()
                .map(|(&kind, &(n, m, p))| {
                    let cost = KindCost {
                        decisions: n,
                        match_us: mean(m, n),
                        pick_us: mean(p, n),
                    };
                    (kind.to_owned(), cost)
                })
                .collect(),
        }
    }
}

impl RoutingCost {
    /// One line for the text report.
    pub fn line(&self) -> String {
        let kinds: Vec<String> = self
            .by_kind
            .iter()
            .map(|(k, c)| format!("{k} {:.1} / {:.1} ({})", c.match_us, c.pick_us, c.decisions))
            .collect();
        format!(
            "routing µs per decision: hash {:.1}, match {:.1}, pick {:.1}; match / pick by kind (decisions): {}",
            self.hash_us,
            self.match_us,
            self.pick_us,
            kinds.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_are_per_decision_and_per_kind() {
        let mut s = CostSums::default();
        let us = Duration::from_micros;
        s.add("cold", us(2), us(1), us(30));
        s.add("kv_match", us(4), us(20), us(6));
        s.add("kv_match", us(6), us(40), us(10));
        let r = s.report();
        assert_eq!(r.hash_us, 4.0);
        assert_eq!(r.match_us, 61.0 / 3.0);
        assert_eq!(r.pick_us, 46.0 / 3.0);
        let kv = &r.by_kind["kv_match"];
        assert_eq!((kv.decisions, kv.match_us, kv.pick_us), (2, 30.0, 8.0));
        assert_eq!(r.by_kind["cold"].pick_us, 30.0);
        assert!(r.line().contains("cold 1.0 / 30.0 (1)"), "{}", r.line());
    }

    #[test]
    fn no_decisions_report_zeros() {
        let r = CostSums::default().report();
        assert_eq!((r.hash_us, r.match_us, r.pick_us), (0.0, 0.0, 0.0));
        assert!(r.by_kind.is_empty());
    }
}
