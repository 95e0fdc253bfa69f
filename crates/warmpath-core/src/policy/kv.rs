//! `kv_aware`: route on the longest actually cached block match, weighed
//! against load.
//!
//! For each eligible backend `w` below `concurrency_threshold`, with `m_w`
//! the leading blocks it holds of the request's chain (0 if its agent is
//! stale) and `B` the chain length:
//!
//! ```text
//! cost_w = prefill_weight * ((B - m_w) + pending_prefill_blocks_w)
//!        + miss_weight    * (B - m_w)
//!        + decode_weight  * in_flight_w
//! ```
//!
//! i.e. the prefill work the backend must still do before this request's
//! first token (its own uncached blocks plus the uncached blocks of requests
//! queued ahead, which the router predicted when it routed them), a charge
//! per block it must write into its cache (a copy of a prefix another
//! backend already holds evicts something there that will miss later), plus
//! a charge per request decoding there. This is the shape of Dynamo's KV
//! router cost (prefill blocks to compute + decode load). The lowest cost
//! wins; ties go to the deeper match, then at random.
//!
//! When no fresh eligible backend holds at least `min_match_blocks` (a cold
//! prefix), `kv.cold_placement` decides: `pressure` (the default) puts it on
//! the backend with the least recent cache pressure and queued prefill work,
//! and keeps later requests of it there while the first is prefilling (see
//! [`place`](super::place)); `ring` uses `prefix_aware` (CHWBL on the prefix
//! key). Either way a cold prefix becomes warm in one place.
//!
//! Under `pressure` placement each prefix also has a **home** (where it was
//! placed or last moved): a copy elsewhere pays the miss charge on its whole
//! chain, so the home keeps the prefix unless its queue is a full prefill
//! longer, and with `kv.rebalance_slack` (default 0.4) a prefix whose
//! popularity fits the gap moves from a backend above the mean load to the
//! least loaded one, the load being the expected one plus
//! `kv.rebalance_payback` (default 2) x the requests a backend already took
//! beyond an even share (see [`rebalance`](super::rebalance)): below
//! saturation that, not the in-flight bounds, is what evens the traffic.
//!
//! Decision: `kv_match` when the winner holds the deepest match; `spill` when
//! a deeper-matching backend was passed over for load, or a cold prefix was
//! placed off its ring owner for cache pressure; `prefix_hash` when a cold
//! prefix went to its ring owner or followed its first request;
//! `least_outstanding` when every backend is full.

use super::place::{Placed, Placer};
use super::rebalance::Rebalance;
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
    /// Extra cost of each block the backend does not hold (>= 0): what
    /// writing a second copy of a prefix costs the fleet's caches. At 0 a
    /// request leaves a holder that has one cold prefill queued for an idle
    /// backend whose full prefill takes as long; at 1 it stays unless the
    /// holder's queue is about twice the request's own prefill.
    pub miss_weight: f64,
    /// When set, no backend takes more than `(1 + share_slack) / n` of the
    /// recent decisions (about the last 50 x n): a request whose pick is over
    /// that goes to the backend under it with the deepest fresh match
    /// (`spill`). In-flight bounds never bind below saturation, so without
    /// this a backend's share is the popularity of the prefixes it happens to
    /// hold. 0..=10; `None` (the default) turns it off. See BENCHMARKS.md.
    pub share_slack: Option<f64>,
    /// Where a prefix no backend holds goes: `pressure` (least recent cache
    /// pressure and queued prefill work, sticky while its first request
    /// prefills; the default) or `ring` (CHWBL on the prefix key).
    pub cold_placement: ColdPlacement,
    /// Decisions per backend over which cache pressure decays (1..=100000;
    /// `pressure` placement only).
    pub pressure_window: f64,
    /// `pressure` placement: backends whose cold cost is within this many
    /// times the prefix's own blocks of the lowest count as equally good,
    /// and the one with the lowest expected load (the popularity of the
    /// prefixes homed there) among them wins (0..=10; 0 places by cost
    /// alone).
    pub placement_tolerance: f64,
    /// `pressure` placement: when set, a backend whose expected load (the
    /// popularity of the prefixes homed there) exceeds the mean by more
    /// than this fraction hands one prefix whose popularity fits the gap to
    /// the least loaded backend — a move, not a copy (see
    /// [`rebalance`](super::rebalance)). 0..=10; `None` turns it off.
    /// Default 0.4, with `rebalance_payback` 2: the payback term, not the
    /// slack, does most of the evening (BENCHMARKS.md).
    pub rebalance_slack: Option<f64>,
    /// With `rebalance_slack`: the load a move evens is the expected load
    /// plus this many times the requests the backend already took beyond an
    /// even share (decayed over about 1000 decisions per backend, capped at
    /// the mean expected load), so an excess a backend ran up is paid back
    /// instead of kept (see [`served`](super::served)). 0..=10; 0 balances
    /// the expected load alone. Default 2: in the scale model of `long` on 7
    /// instances (60 seeds, 2000 requests) it took the busiest instance
    /// from 15.9% on average (worst 17.1%) to 15.1% (worst 15.7%) with
    /// fewer moves and the same hit rate.
    pub rebalance_payback: f64,
}

/// How `kv_aware` places a prefix that no backend holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColdPlacement {
    /// Least recent cache pressure and queued prefill (module docs of `place`).
    #[default]
    Pressure,
    /// Consistent hashing with bounded loads on the prefix key.
    Ring,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            min_match_blocks: 1,
            prefill_weight: 1.0,
            decode_weight: 2.0,
            miss_weight: 1.0,
            share_slack: None,
            cold_placement: ColdPlacement::Pressure,
            pressure_window: 200.0,
            placement_tolerance: 1.0,
            rebalance_slack: Some(0.4),
            rebalance_payback: 2.0,
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
            in_range("kv.share_slack", s, 0.0, 10.0)?;
        }
        if let Some(s) = self.rebalance_slack {
            in_range("kv.rebalance_slack", s, 0.0, 10.0)?;
        }
        in_range("kv.rebalance_payback", self.rebalance_payback, 0.0, 10.0)?;
        in_range("kv.pressure_window", self.pressure_window, 1.0, 100_000.0)?;
        in_range(
            "kv.placement_tolerance",
            self.placement_tolerance,
            0.0,
            10.0,
        )?;
        for (name, v) in [
            ("kv.prefill_weight", self.prefill_weight),
            ("kv.decode_weight", self.decode_weight),
            ("kv.miss_weight", self.miss_weight),
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

/// `Invalid` unless `lo <= v <= hi` (NaN is out of every range).
fn in_range(name: &'static str, v: f64, lo: f64, hi: f64) -> Result<(), PolicyError> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(PolicyError::Invalid {
            name,
            reason: format!("{v} must be a number in {lo}..={hi}"),
        })
    }
}

/// The KV-aware policy.
#[derive(Debug)]
pub struct KvAware {
    pub(super) slots: Vec<WorkerSlot>,
    fallback: PrefixAware,
    pub(super) placer: Placer,
    pub(super) rebalance: Option<Rebalance>,
    pub(super) threshold: u32,
    pub(super) kv: KvConfig,
}

impl KvAware {
    /// Builds over `backends` (their index slots map matches to positions).
    pub fn new(config: &PolicyConfig, backends: &[PolicyBackend]) -> Self {
        KvAware {
            slots: backends.iter().map(|b| b.slot).collect(),
            fallback: PrefixAware::new(config, backends),
            placer: Placer::new(backends, config.kv.pressure_window)
                .with_payback(config.kv.rebalance_payback),
            rebalance: config.kv.rebalance_slack.map(|slack| Rebalance {
                slack,
                backends: backends.len() as u64,
            }),
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

impl KvAware {
    /// Whether position `i` may take a request: eligible and below the
    /// concurrency threshold.
    pub(super) fn usable(&self, loads: &[BackendLoad], i: usize) -> bool {
        i < self.slots.len()
            && loads
                .get(i)
                .is_some_and(|l| l.eligible && l.effective_in_flight() < self.threshold)
    }

    /// A prefix no fresh eligible backend holds (module docs).
    fn place_cold(
        &self,
        input: &RouteInput<'_>,
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        if self.kv.cold_placement == ColdPlacement::Ring {
            return self.fallback.pick_by_key(input.prefix_key, loads, rng);
        }
        let weights = (self.kv.prefill_weight, self.kv.decode_weight);
        let ring = self.fallback.ring();
        let tolerance = self.kv.placement_tolerance * f64::from(input.chain_blocks);
        let mut s = self.placer.lock();
        let placed = s.place(
            input.prefix_key,
            loads,
            |i| self.usable(loads, i),
            ring,
            weights,
            tolerance,
        );
        let (backend, kind) = match placed {
            Some((b, Placed::Pressure)) => (b, DecisionKind::Spill),
            Some((b, Placed::RingOwner | Placed::Remembered)) => (b, DecisionKind::PrefixHash),
            None => (
                least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?,
                DecisionKind::LeastOutstanding,
            ),
        };
        s.set_home(input.prefix_key, backend, false);
        s.record(input.prefix_key, backend, input.chain_blocks);
        Ok(Decision {
            backend,
            kind,
            matched_blocks: 0,
        })
    }

    /// The lowest-cost usable backend and its match (module docs); `None`
    /// when every eligible backend is full. A backend other than `home`
    /// (which holds the deepest match) pays the miss charge on its whole
    /// chain: a copy off the prefix's home is one to let age out.
    pub(super) fn cheapest(
        &self,
        chain: u32,
        matched: &[u32],
        loads: &[BackendLoad],
        home: Option<usize>,
        rng: &mut dyn RngCore,
    ) -> Option<(u32, usize)> {
        let mut best: Option<(f64, u32, usize)> = None;
        let mut ties = 0u32;
        for (i, l) in loads.iter().enumerate().take(self.slots.len()) {
            let inflight = l.effective_in_flight();
            if !l.eligible || inflight >= self.threshold {
                continue;
            }
            let m = matched[i];
            let uncached = f64::from(chain - m.min(chain));
            let written = match home {
                Some(h) if h != i => f64::from(chain),
                _ => uncached,
            };
            let prefill = uncached + l.pending_prefill_blocks as f64;
            let cost = self.kv.prefill_weight * prefill
                + self.kv.miss_weight * written
                + self.kv.decode_weight * f64::from(inflight);
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
        best.map(|(_, m, i)| (m, i))
    }
}

impl Policy for KvAware {
    fn strategy(&self) -> Strategy {
        Strategy::KvAware
    }

    fn moves(&self) -> u64 {
        self.placer.lock().moves
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
            return self.place_cold(input, loads, rng);
        }
        if self.kv.cold_placement == ColdPlacement::Pressure {
            return self.pick_homed(input, &matched, best_match, loads, rng);
        }
        let chain = input.chain_blocks.max(best_match);
        let Some((m, backend)) = self.cheapest(chain, &matched, loads, None, rng) else {
            let backend = least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?;
            return Ok(Decision {
                backend,
                kind: DecisionKind::LeastOutstanding,
                matched_blocks: matched[backend],
            });
        };
        Ok(warm_decision(backend, m, best_match))
    }
}

/// A pick among holders: kv_match when `backend` holds the deepest match
/// (`m == best_match`); a shallower one (or none) won on load, or because
/// the deeper holders were full or the prefix moved: spill.
pub(super) fn warm_decision(backend: usize, m: u32, best_match: u32) -> Decision {
    Decision {
        backend,
        kind: if m == best_match {
            DecisionKind::KvMatch
        } else {
            DecisionKind::Spill
        },
        matched_blocks: m,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::index::MatchResult;
    use crate::policy::test_util::*;

    fn kv(n: usize, threshold: u32) -> KvAware {
        let cfg = PolicyConfig {
            concurrency_threshold: threshold,
            ..Default::default()
        };
        KvAware::new(&cfg, &backends(n))
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
    fn a_holder_busy_with_one_cold_prefill_keeps_its_prefix() {
        fn input_for(m: &MatchResult) -> RouteInput<'_> {
            RouteInput {
                prefix_key: 5,
                chain_blocks: 503,
                matches: Some(m),
            }
        }
        let m = matches(&[(0, 500, true)], 503);
        let mut loads = idle(2);
        loads[0].pending_prefill_blocks = 503; // another prefix's cold prefill
        let d = kv(2, 64).pick(&input_for(&m), &loads, &mut rng()).unwrap();
        assert_eq!((d.backend, d.kind), (0, DecisionKind::KvMatch));
        // Without the miss charge the idle backend's full prefill looks as
        // cheap as waiting, and a second copy is started there.
        let cfg = PolicyConfig {
            kv: KvConfig {
                miss_weight: 0.0,
                ..Default::default()
            },
            ..Default::default()
        };
        let d = KvAware::new(&cfg, &backends(2))
            .pick(&input_for(&m), &loads, &mut rng())
            .unwrap();
        assert_eq!((d.backend, d.kind), (1, DecisionKind::Spill));
        // Two cold prefills queued: now it is worth moving.
        loads[0].pending_prefill_blocks = 1100;
        let d = kv(2, 64).pick(&input_for(&m), &loads, &mut rng()).unwrap();
        assert_eq!(d.backend, 1);
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

    fn cold(key: u64) -> RouteInput<'static> {
        RouteInput {
            prefix_key: key,
            chain_blocks: 500,
            matches: None,
        }
    }

    #[test]
    fn cold_prefixes_fill_the_backends_evenly() {
        let p = kv(7, 64);
        let loads = idle(7);
        let mut placed = [0u32; 7];
        for k in 0..112u64 {
            let d = p
                .pick(
                    &cold(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                    &loads,
                    &mut rng(),
                )
                .unwrap();
            assert!(matches!(
                d.kind,
                DecisionKind::PrefixHash | DecisionKind::Spill
            ));
            placed[d.backend] += 1;
        }
        assert_eq!(placed, [16; 7]);
        // The ring alone leaves some with far more than 16.
        let cfg = PolicyConfig {
            kv: KvConfig {
                cold_placement: ColdPlacement::Ring,
                ..Default::default()
            },
            ..Default::default()
        };
        let ring = KvAware::new(&cfg, &backends(7));
        let mut by_ring = [0u32; 7];
        for k in 0..112u64 {
            let key = k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            by_ring[ring.pick(&cold(key), &loads, &mut rng()).unwrap().backend] += 1;
        }
        assert_ne!(by_ring, [16; 7]);
    }

    #[test]
    fn a_cold_prefix_avoids_queued_prefill_and_its_repeat_follows_it() {
        let p = kv(3, 64);
        let mut loads = idle(3);
        loads[0].pending_prefill_blocks = 1000;
        loads[2].pending_prefill_blocks = 1000;
        let d = p.pick(&cold(5), &loads, &mut rng()).unwrap();
        assert_eq!(d.backend, 1);
        // Its first request is prefilling there (no blocks published yet):
        // the second request of the same prefix follows it although another
        // backend is idle now.
        loads[1].pending_prefill_blocks = 500;
        loads[2].pending_prefill_blocks = 0;
        let again = p.pick(&cold(5), &loads, &mut rng()).unwrap();
        assert_eq!((again.backend, again.kind), (1, DecisionKind::PrefixHash));
        // A different cold prefix goes to the idle one.
        assert_eq!(p.pick(&cold(6), &loads, &mut rng()).unwrap().backend, 2);
    }

    #[test]
    fn cold_placement_and_pressure_window_are_validated() {
        let cfg: KvConfig =
            serde_json::from_str(r#"{"cold_placement":"ring","pressure_window":50}"#).unwrap();
        assert_eq!(cfg.cold_placement, ColdPlacement::Ring);
        assert!(cfg.validate().is_ok());
        assert!(serde_json::from_str::<KvConfig>(r#"{"cold_placement":"hash"}"#).is_err());
        for bad in [0.0, 0.5, f64::NAN, 1e6] {
            let cfg = KvConfig {
                pressure_window: bad,
                ..Default::default()
            };
            assert!(cfg.validate().is_err(), "{bad}");
        }
        for bad in [-0.1, f64::NAN, 11.0] {
            let cfg = KvConfig {
                rebalance_payback: bad,
                ..Default::default()
            };
            assert!(cfg.validate().is_err(), "{bad}");
            let cfg = KvConfig {
                placement_tolerance: bad,
                ..Default::default()
            };
            assert!(cfg.validate().is_err(), "{bad}");
            let cfg = KvConfig {
                rebalance_slack: Some(bad),
                ..Default::default()
            };
            assert!(cfg.validate().is_err(), "{bad}");
        }
        let cfg: KvConfig = serde_json::from_str(r#"{"rebalance_slack":null}"#).unwrap();
        assert_eq!(cfg.rebalance_slack, None);
    }
}
