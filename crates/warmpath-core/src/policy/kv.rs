//! `kv_aware`: route each request by one cost formula over what every
//! backend actually caches, and even the load by **moving** prefixes.
//!
//! ## The cost formula
//!
//! For a request whose block chain is `B` blocks long, every usable backend
//! `w` (eligible and below `concurrency_threshold`) costs
//!
//! ```text
//! cost_w = prefill_weight * (B - m_w + queued_w)    time to its first token
//!        + miss_weight    * write_w                 cache the fleet gives up
//!        + decode_weight  * in_flight_w             decode contention
//! ```
//!
//! - `m_w`: the leading blocks of the chain `w` holds (0 when its agent is
//!   stale); `queued_w`: the uncached blocks of the requests routed there
//!   that have not produced a first byte (the router's own prediction).
//! - `write_w`, the blocks `w` must newly cache: at the prefix's **home**
//!   (where it was placed or last moved) `B - m_w`; at any other backend all
//!   `B`, since a copy off the home is one to let age out (so a holder keeps
//!   its prefix unless its queue is a full prefill longer); and for a prefix
//!   no fresh backend holds `min_match_blocks` of (a **cold** one, the same
//!   `B` everywhere) `B + pressure_w`, where `pressure_w` is the blocks `w`
//!   wrote lately, decayed over `PRESSURE_WINDOW` decisions per backend: a
//!   new prefix lands where the cache turns over slowest (see
//!   [`place`](super::place)). This is the term a capacity model refines.
//!
//! The lowest cost wins; ties go to the deeper match, then at random. This
//! is the shape of Dynamo's KV router cost (prefill blocks to compute plus
//! decode load), with the cache's own cost added.
//!
//! ## Balance: the same costs, then the expected load
//!
//! Below saturation no in-flight bound binds, so a backend's share of the
//! traffic is the popularity of the prefixes homed on it. Each backend's
//! **balance load** is `L_w = E_w + PAYBACK_GAIN * excess_w`: `E_w` the
//! summed decayed popularity of the prefixes homed there
//! ([`home`](super::home)), `excess_w` the requests it already took beyond
//! an even share ([`served`](super::served); capped at the mean `E`). It
//! enters at the two points where cost alone does not decide:
//!
//! - **cold**: every backend within `TIE_BAND * B` of the lowest cost is
//!   equally good, and the lowest `E_w` among them wins (then ring order);
//! - **warm, at its home `h`** (which won on cost and holds the deepest
//!   match): the request and the prefix's home go to the usable backend `t`
//!   with the lowest `L` when `L_h > (1 + rebalance_slack) * mean(L)` and
//!   the prefix's popularity fits the gap (see
//!   [`rebalance`](super::rebalance), which also holds the waits between
//!   moves). A move costs one cold prefill; the old copy ages out.
//!
//! Every constant is named, with why it has its value, in
//! [`tuning`](super::tuning), beside the six knobs.
//!
//! A moved prefix is followed while its first request prefills at its new
//! home, and so is a cold placement. With `cold_placement: ring` a cold
//! prefix goes by CHWBL on the prefix key instead, there are no homes and
//! nothing moves (several router replicas then agree).
//!
//! Decision: `kv_match` when the winner holds the deepest match; `spill` when
//! a deeper-matching backend was passed over for load, a prefix moved, or a
//! cold prefix was placed off its ring owner; `prefix_hash` when a cold
//! prefix went to its ring owner or followed its first request;
//! `least_outstanding` when every backend is full.

use super::home::Home;
use super::place::{Placed, Placer, State};
use super::rebalance::Rebalance;
use super::ring::PrefixAware;
use super::tuning::{ColdPlacement, KvConfig, HOME_HOLDS, PAYBACK_GAIN, PRESSURE_WINDOW, TIE_BAND};
use super::{
    least_loaded, BackendLoad, Decision, DecisionKind, Policy, PolicyBackend, PolicyConfig,
    PolicyError, RouteInput, Strategy,
};
use crate::index::WorkerSlot;
use rand::RngCore;

/// The KV-aware policy.
#[derive(Debug)]
pub struct KvAware {
    slots: Vec<WorkerSlot>,
    fallback: PrefixAware,
    placer: Placer,
    rebalance: Option<Rebalance>,
    threshold: u32,
    kv: KvConfig,
}

impl KvAware {
    /// Builds over `backends` (their index slots map matches to positions).
    pub fn new(config: &PolicyConfig, backends: &[PolicyBackend]) -> Self {
        Self::with_window(config, backends, PRESSURE_WINDOW)
    }

    /// With pressure and popularity decaying over `window` decisions per
    /// backend (tests use a long one to keep counts exact).
    fn with_window(config: &PolicyConfig, backends: &[PolicyBackend], window: f64) -> Self {
        KvAware {
            slots: backends.iter().map(|b| b.slot).collect(),
            fallback: PrefixAware::new(config, backends),
            placer: Placer::new(backends, window).with_payback(PAYBACK_GAIN),
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

    /// Whether position `i` may take a request: eligible and below the
    /// concurrency threshold.
    fn usable(&self, loads: &[BackendLoad], i: usize) -> bool {
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
        let weights = (
            self.kv.prefill_weight,
            self.kv.miss_weight,
            self.kv.decode_weight,
        );
        let ring = self.fallback.ring();
        let band = TIE_BAND * f64::from(input.chain_blocks);
        let mut s = self.placer.lock();
        self.observe(&mut s, input);
        let placed = s.place(
            input.prefix_key,
            input.chain_blocks,
            loads,
            |i| self.usable(loads, i),
            ring,
            weights,
            band,
        );
        let (backend, kind) = match placed {
            Some((b, Placed::Pressure)) => (b, DecisionKind::Cold),
            Some((b, Placed::RingOwner | Placed::Remembered)) => (b, DecisionKind::PrefixHash),
            None => (
                least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?,
                DecisionKind::LeastOutstanding,
            ),
        };
        s.set_home(input.prefix_key, backend, false);
        s.record(input.prefix_key, backend, input.chain_blocks);
        s.cached(input.prefix_key, backend, input.chain_blocks);
        Ok(Decision {
            backend,
            kind,
            matched_blocks: 0,
        })
    }

    /// The lowest-cost usable backend and its match (the module's formula);
    /// `None` when every eligible backend is full. `home` is the backend
    /// that holds the prefix as its home, when there is one.
    fn cheapest(
        &self,
        chain: u32,
        matched: &[u32],
        loads: &[BackendLoad],
        homes: &[usize],
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
            let write = if homes.is_empty() || homes.contains(&i) {
                uncached
            } else {
                f64::from(chain)
            };
            let cost = self.kv.prefill_weight * (uncached + l.pending_prefill_blocks as f64)
                + self.kv.miss_weight * write
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

    /// The warm pick under `pressure` placement: follows a moved prefix
    /// while it prefills at its new home, else the cheapest backend (the
    /// home charged only for what it lacks), and possibly moves the prefix
    /// to even the balance loads (module docs).
    fn pick_homed(
        &self,
        input: &RouteInput<'_>,
        matched: &[u32],
        best_match: u32,
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let key = input.prefix_key;
        let chain = input.chain_blocks.max(best_match);
        let usable = |i: usize| self.usable(loads, i);
        let mut s = self.placer.lock();
        self.observe(&mut s, input);
        let home: Option<Home> = s.home(key).filter(|h| usable(h.backend as usize));
        let at = |h: &Home| h.backend as usize;
        if let Some(h) = home.filter(|h| h.moved && matched[at(h)] < best_match) {
            if s.following(&h, loads) {
                let b = at(&h);
                s.record(key, b, input.chain_blocks.saturating_sub(matched[b]));
                s.cached(key, b, input.chain_blocks);
                return Ok(Decision {
                    backend: b,
                    kind: DecisionKind::Spill,
                    matched_blocks: matched[b],
                });
            }
        }
        // The home holds it (LRU may have trimmed a few of its last blocks
        // there: it writes them back rather than hand the prefix to a copy).
        let (num, den) = HOME_HOLDS;
        let holding =
            home.filter(|h| u64::from(matched[at(h)]) * den >= u64::from(best_match) * num);
        // Its agent's view is stale: it may well hold it; decide nothing.
        let stale = home.is_some_and(|h| {
            let slot = self.slots[at(&h)];
            input
                .matches
                .and_then(|m| m.of(slot))
                .is_some_and(|w| !w.fresh)
        });
        // The home and its deliberate copies that hold the prefix.
        let holds = |i: usize| u64::from(matched[i]) * den >= u64::from(best_match) * num;
        let homes: Vec<usize> = holding.map_or_else(Vec::new, |h| {
            h.holders()
                .filter(|&i| i == at(&h) || (usable(i) && holds(i)))
                .collect()
        });
        let Some((mut m, mut backend)) = self.cheapest(chain, matched, loads, &homes, rng) else {
            let backend = least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?;
            s.record(
                key,
                backend,
                input.chain_blocks.saturating_sub(matched[backend]),
            );
            s.cached(key, backend, input.chain_blocks);
            return Ok(Decision {
                backend,
                kind: DecisionKind::LeastOutstanding,
                matched_blocks: matched[backend],
            });
        };
        match (holding, &self.rebalance) {
            (Some(h), Some(rb)) if homes.contains(&backend) && m == best_match => {
                match s.replicas(rb, &h, usable) {
                    Some(true) => {
                        if let Some(d) = self.replicate(&mut s, input, &h, matched, loads) {
                            return Ok(d);
                        }
                    }
                    Some(false) => s.copy(key, None),
                    None => {}
                }
                if let Some(t) = s.propose_move(rb, &h, chain, loads, usable) {
                    s.move_home(key, at(&h), t);
                    (m, backend) = (matched[t], t);
                }
            }
            // Its home lost it (or it had none): it lives where it went.
            (None, _) if !stale && home.is_none_or(|h| at(&h) != backend) => {
                s.set_home(key, backend, false);
            }
            _ => {}
        }
        s.record(key, backend, input.chain_blocks.saturating_sub(m));
        s.cached(key, backend, input.chain_blocks);
        Ok(warm_decision(backend, m, best_match))
    }

    /// Starts one more warm copy of `home`'s prefix: the request goes to
    /// the backend with the lowest cold cost among those that do not hold
    /// it deliberately (the eviction term included), decision `replicate`.
    fn replicate(
        &self,
        s: &mut State,
        input: &RouteInput<'_>,
        home: &Home,
        matched: &[u32],
        loads: &[BackendLoad],
    ) -> Option<Decision> {
        let weights = (
            self.kv.prefill_weight,
            self.kv.miss_weight,
            self.kv.decode_weight,
        );
        let band = TIE_BAND * f64::from(input.chain_blocks);
        let (t, _) = s.place(
            input.prefix_key,
            input.chain_blocks,
            loads,
            |i| self.usable(loads, i) && !home.holds(i),
            self.fallback.ring(),
            weights,
            band,
        )?;
        s.copy(input.prefix_key, Some(t));
        s.record(
            input.prefix_key,
            t,
            input.chain_blocks.saturating_sub(matched[t]),
        );
        s.cached(input.prefix_key, t, input.chain_blocks);
        Some(Decision {
            backend: t,
            kind: DecisionKind::Replicate,
            matched_blocks: matched[t],
        })
    }

    /// Feeds the index's fresh view of this prefix into the resident model:
    /// what each listed holder has of the chain, and that the prefix's home,
    /// when not listed, has none of it.
    fn observe(&self, s: &mut State, input: &RouteInput<'_>) {
        let Some(m) = input.matches else {
            return;
        };
        if !s.resident.any() {
            return;
        }
        let key = input.prefix_key;
        for w in m.workers.iter().filter(|w| w.fresh) {
            if let Some(i) = self.slots.iter().position(|s| *s == w.slot) {
                s.observe(key, i, w.blocks);
            }
        }
        if let Some(h) = s.home(key) {
            let i = h.backend as usize;
            if self.slots.get(i).is_some_and(|slot| m.of(*slot).is_none()) {
                s.observe(key, i, 0);
            }
        }
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
        let Some((m, backend)) = self.cheapest(chain, &matched, loads, &[], rng) else {
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
fn warm_decision(backend: usize, m: u32, best_match: u32) -> Decision {
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
    use crate::policy::place::skew;
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
            // At idle nothing is at a limit: a cold placement is `cold` (or
            // the ring owner's `prefix_hash`), never `spill`.
            assert!(
                matches!(d.kind, DecisionKind::PrefixHash | DecisionKind::Cold),
                "{:?}",
                d.kind
            );
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

    /// `kv_aware` over 3 backends, 100 decisions after keys 1..=4 were
    /// homed on backends 0, 0, 1, 2 with 40, 30, 20, 10 requests (expected
    /// loads 70 / 20 / 10; nothing decays).
    fn skewed_kv(rebalance_slack: Option<f64>) -> KvAware {
        let mut cfg = PolicyConfig::default();
        cfg.kv.rebalance_slack = rebalance_slack;
        let p = KvAware::with_window(&cfg, &backends(3), 1e5);
        skew(&mut p.placer.lock());
        p
    }

    /// A 50-block request of `key` that `holders` hold whole.
    fn req<'a>(key: u64, holders: &[u16], m: &'a mut MatchResult) -> RouteInput<'a> {
        let list: Vec<(u16, u32, bool)> = holders.iter().map(|&s| (s, 50, true)).collect();
        req_with(key, &list, m)
    }

    /// A 50-block request of `key`; `list` is (slot, blocks, fresh).
    fn req_with<'a>(key: u64, list: &[(u16, u32, bool)], m: &'a mut MatchResult) -> RouteInput<'a> {
        *m = matches(list, 50);
        let m: &'a MatchResult = m;
        RouteInput {
            prefix_key: key,
            chain_blocks: 50,
            matches: Some(m),
        }
    }

    #[test]
    fn a_prefix_changes_home_only_when_its_home_lost_it() {
        let p = skewed_kv(Some(0.1));
        let loads = idle(3);
        let mut m = MatchResult::default();
        let home = |p: &KvAware| p.placer.lock().home(3).unwrap().backend;
        // Key 3 lives on 1. LRU trimmed 5 of its blocks there, a copy on 0
        // is whole: 1 writes them back.
        let d = p
            .pick(
                &req_with(3, &[(1, 45, true), (0, 50, true)], &mut m),
                &loads,
                &mut rng(),
            )
            .unwrap();
        assert_eq!(
            (d.backend, d.kind, d.matched_blocks),
            (1, DecisionKind::Spill, 45)
        );
        // 1's agent is stale: the request goes to the copy, the home stays.
        let d = p
            .pick(
                &req_with(3, &[(1, 50, false), (0, 50, true)], &mut m),
                &loads,
                &mut rng(),
            )
            .unwrap();
        assert_eq!((d.backend, home(&p)), (0, 1));
        // 1 lost it (fresh, no block): it lives on 0 now.
        let d = p.pick(&req(3, &[0], &mut m), &loads, &mut rng()).unwrap();
        assert_eq!((d.backend, home(&p)), (0, 0));
        assert_eq!(p.placer.lock().moves, 0);
    }

    #[test]
    fn a_moved_prefix_is_followed_until_its_new_home_holds_it() {
        let p = skewed_kv(Some(0.1));
        let mut loads = idle(3);
        let mut m = MatchResult::default();
        // Key 2 (30 of 100) is cached on backend 0 (70): it moves to 2 (10).
        let d = p.pick(&req(2, &[0], &mut m), &loads, &mut rng()).unwrap();
        assert_eq!(
            (d.backend, d.kind, d.matched_blocks),
            (2, DecisionKind::Spill, 0)
        );
        // While that request prefills there, the next one follows it
        // instead of going back to the copy on 0.
        loads[2].pending_prefill_blocks = 50;
        loads[2].in_flight = 1;
        let d = p.pick(&req(2, &[0], &mut m), &loads, &mut rng()).unwrap();
        assert_eq!((d.backend, d.kind), (2, DecisionKind::Spill));
        // Once 2 holds it, 2 keeps it although it is busier: the stale copy
        // on 0 pays the miss charge, and no other move follows.
        loads[2].pending_prefill_blocks = 0;
        loads[2].in_flight = 3;
        for _ in 0..20 {
            let d = p
                .pick(&req(2, &[0, 2], &mut m), &loads, &mut rng())
                .unwrap();
            assert_eq!((d.backend, d.kind), (2, DecisionKind::KvMatch));
        }
        assert_eq!(p.placer.lock().moves, 1);
        // The swap: key 4, the least popular on 2, is reserved on 0; its
        // next cold request goes there although 0 is the busiest.
        let k4 = p.placer.lock().home(4).unwrap();
        assert!(k4.reserved && !k4.moved && k4.backend == 0, "{k4:?}");
        let d = p.pick(&req(4, &[], &mut m), &idle(3), &mut rng()).unwrap();
        assert_eq!((d.backend, d.kind), (0, DecisionKind::PrefixHash));
        assert!(!p.placer.lock().home(4).unwrap().reserved);
        // Without rebalancing nothing moves: the home keeps it.
        let off = skewed_kv(None);
        let d = off
            .pick(&req(2, &[0, 2], &mut m), &loads, &mut rng())
            .unwrap();
        assert_eq!(d.backend, 0);
        let d = off
            .pick(&req(2, &[0], &mut m), &idle(3), &mut rng())
            .unwrap();
        assert_eq!((d.backend, d.kind), (0, DecisionKind::KvMatch));
    }

    #[test]
    fn a_prefix_still_prefilling_is_never_moved() {
        let p = skewed_kv(Some(0.1));
        let mut loads = idle(3);
        let mut m = MatchResult::default();
        // Key 2's home (0, overloaded) holds none of it yet: its first
        // request there is prefilling. Its next one follows, it is not moved.
        loads[0].pending_prefill_blocks = 50;
        for _ in 0..5 {
            let d = p.pick(&req(2, &[], &mut m), &loads, &mut rng()).unwrap();
            assert_eq!((d.backend, d.kind), (0, DecisionKind::PrefixHash));
        }
        assert_eq!(p.placer.lock().moves, 0);
    }

    #[test]
    fn a_too_hot_prefix_gets_a_copy_until_its_load_falls() {
        let p = KvAware::with_window(&PolicyConfig::default(), &backends(3), 1e5);
        {
            let mut s = p.placer.lock();
            for (key, at, reqs) in [(1u64, 0usize, 90), (2, 1, 5), (3, 2, 5)] {
                s.set_home(key, at, false);
                for _ in 0..reqs {
                    s.record(key, at, 0);
                }
            }
            s.seq += 100;
        }
        let loads = idle(3);
        let mut m = MatchResult::default();
        // Key 1 brings 90 of 100 requests: more than 1.4 x the mean (33)
        // on one backend. Its next request starts a copy elsewhere.
        let d = p.pick(&req(1, &[0], &mut m), &loads, &mut rng()).unwrap();
        assert_eq!(d.kind, DecisionKind::Replicate);
        let copy = d.backend;
        assert_ne!(copy, 0);
        assert_eq!(p.placer.lock().home(1).unwrap().count(), 2);
        // Both hold it: its traffic goes to either, warm; 45 per holder is
        // within the slack, so no third copy; nothing moves.
        let mut seen = [0u32; 3];
        let mut r = rng();
        for _ in 0..40 {
            let d = p
                .pick(&req(1, &[0, copy as u16], &mut m), &loads, &mut r)
                .unwrap();
            assert_eq!(d.kind, DecisionKind::KvMatch);
            seen[d.backend] += 1;
        }
        assert!(seen[0] > 5 && seen[copy] > 5, "{seen:?}");
        assert_eq!(p.placer.lock().home(1).unwrap().count(), 2);
        assert_eq!(p.placer.lock().moves, 0);
        // The other prefixes grow: one backend serves key 1 within an even
        // share again, and the copy is dropped.
        {
            let mut s = p.placer.lock();
            for _ in 0..300 {
                s.record(2, 1, 0);
                s.record(3, 2, 0);
            }
        }
        let d = p
            .pick(&req(1, &[0, copy as u16], &mut m), &loads, &mut rng())
            .unwrap();
        assert_eq!(d.kind, DecisionKind::KvMatch);
        assert_eq!(p.placer.lock().home(1).unwrap().count(), 1);
        // Without the balance knob nothing is copied.
        let mut cfg = PolicyConfig::default();
        cfg.kv.rebalance_slack = None;
        let off = KvAware::with_window(&cfg, &backends(3), 1e5);
        {
            let mut s = off.placer.lock();
            s.set_home(1, 0, false);
            for _ in 0..90 {
                s.record(1, 0, 0);
            }
            s.seq += 100;
        }
        let d = off.pick(&req(1, &[0], &mut m), &loads, &mut rng()).unwrap();
        assert_eq!((d.backend, d.kind), (0, DecisionKind::KvMatch));
    }
}
