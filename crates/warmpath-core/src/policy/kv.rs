//! `kv_aware`: route on the longest actually cached block match, weighed
//! against load.
//!
//! For each eligible backend `w` below `concurrency_threshold`, with `m_w`
//! the leading blocks it holds of the request's chain (0 if its agent is
//! stale) and `B` the chain length:
//!
//! ```text
//! cost_w = prefill_weight * ((B - m_w) + pending_prefill_blocks_w)
//!        + decode_weight  * in_flight_w
//! ```
//!
//! i.e. the prefill work the backend must still do before this request's
//! first token (its own uncached blocks plus the uncached blocks of requests
//! queued ahead, which the router predicted when it routed them), plus a
//! charge per request decoding there. This is the shape of Dynamo's KV
//! router cost (prefill blocks to compute + decode load). The lowest cost
//! wins; ties go to the deeper match, then at random.
//!
//! Falls back to `prefix_aware` (CHWBL) when no fresh eligible backend holds
//! at least `min_match_blocks`, so cold prefixes still get sticky placement
//! and become warm in one place. Decision: `kv_match` when the winner holds at
//! least `min_match_blocks`; `spill` when a deeper-matching backend was passed
//! over for load; `least_outstanding` when every backend is full.

use super::ring::PrefixAware;
use super::{
    least_loaded, BackendLoad, Decision, DecisionKind, Policy, PolicyBackend, PolicyConfig,
    PolicyError, RouteInput, Strategy,
};
use crate::index::WorkerSlot;
use rand::RngCore;
use serde::{Deserialize, Serialize};

/// `kv_aware` knobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvConfig {
    /// Fewest matched blocks that count as a useful match (>= 1).
    pub min_match_blocks: u32,
    /// Weight of prefill blocks still to compute (>= 0).
    pub prefill_weight: f64,
    /// Cost of one request in flight, in blocks (>= 0).
    pub decode_weight: f64,
    /// When set, no backend takes more than `(1 + share_slack) / n` of the
    /// recent decisions (about the last 50 x n): a request whose pick is over
    /// that goes to the backend under it with the deepest fresh match
    /// (`spill`). In-flight bounds never bind below saturation, so without
    /// this a backend's share is the popularity of the prefixes it happens to
    /// hold. 0..=10; `None` (the default) turns it off. See BENCHMARKS.md.
    pub share_slack: Option<f64>,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            min_match_blocks: 1,
            prefill_weight: 1.0,
            decode_weight: 2.0,
            share_slack: None,
        }
    }
}

impl KvConfig {
    pub(crate) fn validate(&self) -> Result<(), PolicyError> {
        if self.min_match_blocks == 0 {
            return Err(PolicyError::Invalid {
                name: "kv.min_match_blocks",
                reason: "must be at least 1".into(),
            });
        }
        if let Some(s) = self.share_slack {
            if !((0.0..=10.0).contains(&s)) {
                return Err(PolicyError::Invalid {
                    name: "kv.share_slack",
                    reason: format!("{s} must be a number in 0..=10"),
                });
            }
        }
        for (name, v) in [
            ("kv.prefill_weight", self.prefill_weight),
            ("kv.decode_weight", self.decode_weight),
        ] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(PolicyError::Invalid {
                    name,
                    reason: format!("{v} must be a finite number >= 0"),
                });
            }
        }
        Ok(())
    }
}

/// The KV-aware policy.
#[derive(Debug, Clone)]
pub struct KvAware {
    slots: Vec<WorkerSlot>,
    fallback: PrefixAware,
    threshold: u32,
    kv: KvConfig,
}

impl KvAware {
    /// Builds over `backends` (their index slots map matches to positions).
    pub fn new(config: &PolicyConfig, backends: &[PolicyBackend]) -> Self {
        KvAware {
            slots: backends.iter().map(|b| b.slot).collect(),
            fallback: PrefixAware::new(config, backends),
            threshold: config.concurrency_threshold,
            kv: config.kv.clone(),
        }
    }

    /// Fresh matched blocks of the backend at each position.
    fn matched(&self, input: &RouteInput<'_>) -> Vec<u32> {
        let Some(m) = input.matches else {
            return vec![0; self.slots.len()];
        };
        self.slots
            .iter()
            .map(|s| m.of(*s).filter(|x| x.fresh).map_or(0, |x| x.blocks))
            .collect()
    }
}

impl Policy for KvAware {
    fn strategy(&self) -> Strategy {
        Strategy::KvAware
    }

    fn pick(
        &self,
        input: &RouteInput<'_>,
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let matched = self.matched(input);
        let eligible = |i: usize| loads.get(i).is_some_and(|l| l.eligible);
        let best_match = (0..self.slots.len())
            .filter(|&i| eligible(i))
            .map(|i| matched[i])
            .max()
            .ok_or(PolicyError::NoBackend)?;
        if best_match < self.kv.min_match_blocks {
            return self.fallback.pick_by_key(input.prefix_key, loads, rng);
        }
        let chain = input.chain_blocks.max(best_match);
        let mut best: Option<(f64, u32, usize)> = None;
        let mut ties = 0u32;
        for (i, l) in loads.iter().enumerate().take(self.slots.len()) {
            let inflight = l.effective_in_flight();
            if !l.eligible || inflight >= self.threshold {
                continue;
            }
            let m = matched[i];
            let prefill = f64::from(chain - m.min(chain)) + l.pending_prefill_blocks as f64;
            let cost =
                self.kv.prefill_weight * prefill + self.kv.decode_weight * f64::from(inflight);
            let better = match best {
                None => true,
                Some((c, bm, _)) => cost < c || (cost == c && m > bm),
            };
            let tie = matches!(best, Some((c, bm, _)) if cost == c && m == bm);
            if better {
                best = Some((cost, m, i));
                ties = 1;
            } else if tie {
                ties += 1;
                if rng.next_u32() % ties == 0 {
                    best = Some((cost, m, i));
                }
            }
        }
        let Some((_, m, backend)) = best else {
            let backend = least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?;
            return Ok(Decision {
                backend,
                kind: DecisionKind::LeastOutstanding,
                matched_blocks: matched[backend],
            });
        };
        // The deepest match won: kv_match. A shallower one (or none) won on
        // load, or because the deeper holders were full: spill.
        let kind = if m == best_match {
            DecisionKind::KvMatch
        } else {
            DecisionKind::Spill
        };
        Ok(Decision {
            backend,
            kind,
            matched_blocks: m,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::index::{MatchResult, WorkerMatch};
    use crate::policy::test_util::*;

    fn kv(n: usize, threshold: u32) -> KvAware {
        let cfg = PolicyConfig {
            concurrency_threshold: threshold,
            ..Default::default()
        };
        KvAware::new(&cfg, &backends(n))
    }

    fn matches(list: &[(u16, u32, bool)], chain: u32) -> MatchResult {
        MatchResult {
            workers: list
                .iter()
                .map(|&(slot, blocks, fresh)| WorkerMatch {
                    slot,
                    blocks,
                    gpu_blocks: blocks,
                    fresh,
                })
                .collect(),
            chain_len: chain,
        }
    }

    #[test]
    fn picks_the_deepest_match() {
        let p = kv(4, 8);
        let m = matches(&[(1, 10, true), (2, 40, true)], 50);
        let input = RouteInput {
            prefix_key: 5,
            chain_blocks: 50,
            matches: Some(&m),
        };
        let d = p.pick(&input, &idle(4), &mut rng()).unwrap();
        assert_eq!(
            (d.backend, d.kind, d.matched_blocks),
            (2, DecisionKind::KvMatch, 40)
        );
    }

    #[test]
    fn load_outweighs_a_small_match() {
        let p = kv(2, 64);
        let m = matches(&[(0, 2, true)], 100);
        let input = RouteInput {
            prefix_key: 5,
            chain_blocks: 100,
            matches: Some(&m),
        };
        let mut loads = idle(2);
        loads[0].pending_prefill_blocks = 500; // a long queue of cold prefills
        let d = p.pick(&input, &loads, &mut rng()).unwrap();
        assert_eq!((d.backend, d.kind), (1, DecisionKind::Spill));
    }

    #[test]
    fn spills_when_the_match_holder_is_full() {
        let p = kv(3, 2);
        let m = matches(&[(0, 30, true), (1, 10, true)], 32);
        let input = RouteInput {
            prefix_key: 5,
            chain_blocks: 32,
            matches: Some(&m),
        };
        let mut loads = idle(3);
        loads[0].in_flight = 2;
        let d = p.pick(&input, &loads, &mut rng()).unwrap();
        assert_eq!(
            (d.backend, d.kind, d.matched_blocks),
            (1, DecisionKind::Spill, 10)
        );
        for l in &mut loads {
            l.in_flight = 2;
        }
        let d = p.pick(&input, &loads, &mut rng()).unwrap();
        assert_eq!(d.kind, DecisionKind::LeastOutstanding);
    }

    #[test]
    fn falls_back_to_prefix_hash_when_cold_or_stale() {
        let p = kv(4, 8);
        let cold = matches(&[], 20);
        let stale = matches(&[(3, 20, false)], 20);
        let loads = idle(4);
        for m in [&cold, &stale] {
            let input = RouteInput {
                prefix_key: 77,
                chain_blocks: 20,
                matches: Some(m),
            };
            let d = p.pick(&input, &loads, &mut rng()).unwrap();
            let expect = p.fallback.pick_by_key(77, &loads, &mut rng()).unwrap();
            assert_eq!(d.kind, DecisionKind::PrefixHash);
            assert_eq!(d.backend, expect.backend);
        }
        let none = RouteInput {
            prefix_key: 77,
            chain_blocks: 0,
            matches: None,
        };
        assert_eq!(
            p.pick(&none, &loads, &mut rng()).unwrap().kind,
            DecisionKind::PrefixHash
        );
    }

    #[test]
    fn ineligible_backends_are_never_picked() {
        let p = kv(2, 8);
        let m = matches(&[(0, 9, true)], 10);
        let input = RouteInput {
            prefix_key: 1,
            chain_blocks: 10,
            matches: Some(&m),
        };
        let mut loads = idle(2);
        loads[0].eligible = false;
        let d = p.pick(&input, &loads, &mut rng()).unwrap();
        assert_eq!(d.backend, 1);
        loads[1].eligible = false;
        assert_eq!(
            p.pick(&input, &loads, &mut rng()),
            Err(PolicyError::NoBackend)
        );
    }
}
