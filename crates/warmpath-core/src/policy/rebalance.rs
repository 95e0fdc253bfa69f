//! `kv.rebalance_slack` and `kv.rebalance_payback`: `kv_aware` evens the
//! backends' loads by **moving** a prefix, never by copying it.
//!
//! Why: below saturation each prefix stays where it is cached, so a backend's
//! share is the sum of its prefixes' popularities, fixed when they were
//! placed — before their popularity was known. A bound on recent share
//! (`kv.share_slack`) restores balance by starting second copies, and in a
//! fleet whose caches just hold the working set each copy evicts a prefix
//! that then misses. A move costs one cold prefill on the new home (and
//! whatever that evicts there, once); the old copy ages out of its former
//! home's LRU since no request touches it any more, which frees the room.
//!
//! What: on a warm request whose prefix is cached at its home `h` (published,
//! so never one still prefilling), with `L` the **balance loads** — each
//! backend's expected load ([`home`](super::home)) plus `rebalance_payback`
//! x the requests it already took beyond an even share
//! ([`served`](super::served)), that term capped at the mean expected load
//! — `mean` their mean over usable backends, `t` the usable backend with the
//! lowest `L`, `D = L_h - L_t` and `p` the prefix's popularity, the request
//! and the prefix's home go to `t` when
//!
//! - `L_h > (1 + rebalance_slack) * mean`,
//! - `0.15 min(D, mean) <= p <= 0.85 D`: the sum of squared deviations
//!   `2p(p - D)` falls by at least half of the best a single move could do
//!   (`p = D/2`), so `t` ends below `h`'s old load and `h` above `t`'s: no
//!   ping-pong; a gap wider than the mean (a large excess to pay back) takes
//!   any prefix worth 15% of a backend's load, so a growing excess never
//!   shuts every prefix out;
//! - the prefix has had its home for `20 n` decisions (its popularity is
//!   an estimate worth acting on, and it has not just moved), the fleet has
//!   seen `10 n` requests, and the last move was `2 n` decisions ago.
//!
//! Why the payback term: the expected loads steer the traffic to come, so
//! on their own they leave what already went — the excess a backend ran up
//! while the caches filled, and a steady error of up to the slack — in every
//! share counted over a run. The payback is an integral term that grows
//! while that error lasts until a move is worth it; with it the slack can
//! be wide (0.4), so fewer moves chase the noise of the popularity estimate.
//!
//! A move swaps: the least popular prefix homed on `t` (the likeliest
//! victim of the moved blocks there) is reserved on `h`, whose room the
//! moved prefix's stale copy frees, so its next cold request goes there
//! instead of cascading through cold placement (a warm one still goes where
//! it is cached).
//!
//! The next requests of a moved prefix follow it while its first request
//! there prefills (as a cold placement's do), and a copy left off its home
//! is charged as uncached in the miss term, so the stale copy is not chosen
//! over the new home once both hold it (nor over a home that LRU trimmed
//! by at most an eighth). A prefix changes home otherwise only when its
//! home lost it (the request went where the cost said, and it lives there
//! now) — not when the home's agent is merely stale.

use super::home::Home;
use super::kv::{warm_decision, KvAware};
use super::place::State;
use super::{least_loaded, BackendLoad, Decision, DecisionKind, PolicyError, RouteInput};
use rand::RngCore;

/// Which gaps [`State::propose_move`] acts on (module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rebalance {
    /// Excess over the mean expected load that triggers a move.
    pub(crate) slack: f64,
    /// Backends in the snapshot.
    pub(crate) backends: u64,
}

impl Rebalance {
    /// Decisions a prefix keeps its home before it may move.
    fn cooldown(&self) -> u64 {
        20 * self.backends
    }
}

impl State {
    /// Where `home`'s prefix should move to even the expected loads, if
    /// anywhere (module docs). Its home must be usable and hold it.
    pub(crate) fn propose_move(
        &self,
        rb: &Rebalance,
        home: &Home,
        loads: &[BackendLoad],
        usable: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let n = rb.backends;
        if self.seq.saturating_sub(home.since) < rb.cooldown()
            || self
                .last_move
                .is_some_and(|m| self.seq.saturating_sub(m) < 2 * n)
        {
            return None;
        }
        let load = self.balance_load();
        let m = loads.len().min(self.homes.loads().len());
        let mut total = 0.0;
        let mut count = 0u32;
        let mut low: Option<(usize, f64)> = None;
        for b in (0..m).filter(|&b| usable(b)) {
            let l = load(b);
            total += l;
            count += 1;
            if b != home.backend as usize && low.is_none_or(|(_, lo)| l < lo) {
                low = Some((b, l));
            }
        }
        // Decayed requests seen, in requests.
        if count < 2 || total / self.unit < 10.0 * n as f64 {
            return None;
        }
        let (t, lt) = low?;
        if home.backend as usize >= m {
            return None;
        }
        let lh = load(home.backend as usize);
        let mean = total / f64::from(count);
        let d = lh - lt;
        // A gap wider than a backend's mean load (a large excess to pay
        // back) still takes any prefix worth 15% of that mean.
        let fits = (0.15 * d.min(mean)..=0.85 * d).contains(&home.pop);
        (lh > (1.0 + rb.slack) * mean && fits).then_some(t)
    }

    /// The load the rebalancer evens, per backend, in `unit`s: its expected
    /// load (the popularity of the prefixes homed there) plus
    /// `kv.rebalance_payback` x the requests it took beyond an even share
    /// (see [`served`](super::served)). The payback term is capped at the
    /// mean expected load either way, so a backend back from a long outage
    /// (far below an even share) draws moves at the usual pace, not a flood.
    pub(crate) fn balance_load(&self) -> impl Fn(usize) -> f64 + '_ {
        let expected = self.homes.loads();
        let k = self.payback * self.unit;
        let cap = if k > 0.0 {
            expected.iter().sum::<f64>() / expected.len().max(1) as f64
        } else {
            0.0
        };
        move |b| {
            let e = expected.get(b).copied().unwrap_or(0.0);
            e + (k * self.served.excess(b)).clamp(-cap, cap)
        }
    }
}

impl KvAware {
    /// A warm request under `pressure` placement: follows a moved prefix
    /// while it prefills at its new home, else the cheapest backend (the
    /// home favoured over stale copies), and possibly moves the prefix to
    /// even the expected loads (see [`rebalance`](super::rebalance)).
    pub(super) fn pick_homed(
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
        let home: Option<Home> = s.home(key).filter(|h| usable(h.backend as usize));
        let at = |h: &Home| h.backend as usize;
        if let Some(h) = home.filter(|h| h.moved && matched[at(h)] < best_match) {
            if s.following(&h, loads) {
                let b = at(&h);
                s.record(key, b, input.chain_blocks.saturating_sub(matched[b]));
                return Ok(Decision {
                    backend: b,
                    kind: DecisionKind::Spill,
                    matched_blocks: matched[b],
                });
            }
        }
        // The home holds it (LRU may have trimmed a few of its last blocks
        // there: it writes them back rather than hand the prefix to a copy).
        let holding = home.filter(|h| u64::from(matched[at(h)]) * 8 >= u64::from(best_match) * 7);
        // Its agent's view is stale: it may well hold it; decide nothing.
        let stale = home.is_some_and(|h| {
            let slot = self.slots[at(&h)];
            input
                .matches
                .and_then(|m| m.of(slot))
                .is_some_and(|w| !w.fresh)
        });
        let Some((mut m, mut backend)) =
            self.cheapest(chain, matched, loads, holding.as_ref().map(at), rng)
        else {
            let backend = least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?;
            s.record(
                key,
                backend,
                input.chain_blocks.saturating_sub(matched[backend]),
            );
            return Ok(Decision {
                backend,
                kind: DecisionKind::LeastOutstanding,
                matched_blocks: matched[backend],
            });
        };
        match (holding, &self.rebalance) {
            (Some(h), Some(rb)) if at(&h) == backend && m == best_match => {
                if let Some(t) = s.propose_move(rb, &h, loads, usable) {
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
        Ok(warm_decision(backend, m, best_match))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::index::MatchResult;
    use crate::policy::place::Placer;
    use crate::policy::test_util::*;
    use crate::policy::{Policy, PolicyConfig};

    const RB: Rebalance = Rebalance {
        slack: 0.1,
        backends: 3,
    };

    /// Keys 1..=4 homed on backends 0, 0, 1, 2 with 40, 30, 20, 10
    /// requests, 100 decisions ago: expected loads 70 / 20 / 10.
    fn skewed() -> Placer {
        let p = Placer::new(&backends(3), 1e5);
        skew(&mut p.lock());
        p
    }

    fn skew(s: &mut State) {
        for (key, at, reqs) in [(1u64, 0usize, 40), (2, 0, 30), (3, 1, 20), (4, 2, 10)] {
            s.set_home(key, at, false);
            for _ in 0..reqs {
                s.record(key, at, 0);
            }
        }
        s.seq += 100;
    }

    /// `kv_aware` over 3 backends in the state of [`skewed`].
    fn skewed_kv(rebalance_slack: Option<f64>) -> KvAware {
        let mut cfg = PolicyConfig::default();
        cfg.kv.pressure_window = 1e5;
        cfg.kv.rebalance_slack = rebalance_slack;
        let p = KvAware::new(&cfg, &backends(3));
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
    fn a_prefix_that_fits_the_gap_moves_to_the_least_loaded() {
        let loads = idle(3);
        let p = skewed();
        let s = p.lock();
        let (k1, k2, k3) = (s.home(1).unwrap(), s.home(2).unwrap(), s.home(3).unwrap());
        // Mean 33: backend 0 is over it; D = 60, and 30 and 40 both fit
        // within 0.15 D ..= 0.85 D.
        assert_eq!(s.propose_move(&RB, &k2, &loads, |_| true), Some(2));
        assert_eq!(s.propose_move(&RB, &k1, &loads, |_| true), Some(2));
        // The least loaded is not usable: the next least.
        assert_eq!(s.propose_move(&RB, &k2, &loads, |b| b != 2), Some(1));
        // Backend 1 is below the mean: nothing of it moves.
        assert_eq!(s.propose_move(&RB, &k3, &loads, |_| true), None);
        // Within the slack: nothing moves.
        let wide = Rebalance { slack: 1.2, ..RB };
        assert_eq!(s.propose_move(&wide, &k2, &loads, |_| true), None);
    }

    #[test]
    fn moves_are_rare_never_of_a_fresh_home_nor_past_the_gap() {
        let loads = idle(3);
        let p = skewed();
        let mut s = p.lock();
        let k1 = s.home(1).unwrap();
        // A key homed moments ago never moves.
        s.set_home(5, 0, false);
        for _ in 0..5 {
            s.record(5, 0, 0);
        }
        let k5 = s.home(5).unwrap();
        assert_eq!(s.propose_move(&RB, &k5, &loads, |_| true), None);
        // Right after a move, no other one.
        s.set_home(2, 2, true);
        s.record(2, 2, 500);
        assert_eq!(s.propose_move(&RB, &k1, &loads, |_| true), None);
        // Loads 45 / 20 + 6 / 41 a few decisions later: backend 0 is still
        // over the mean, but key 1 (40) is more than 0.85 x the gap (19).
        for _ in 0..6 {
            s.record(99, 1, 0);
        }
        assert_eq!(s.propose_move(&RB, &k1, &loads, |_| true), None);
        assert_eq!(s.moves, 1);
    }

    #[test]
    fn no_move_before_the_fleet_has_seen_enough() {
        let p = Placer::new(&backends(3), 1e5);
        let mut s = p.lock();
        s.set_home(1, 0, false);
        for _ in 0..19 {
            s.record(1, 0, 0);
        }
        s.set_home(2, 0, false);
        for _ in 0..10 {
            s.record(2, 0, 0);
        }
        s.seq += 1000;
        // 29 requests < 10 x 3, although backend 0 has every one.
        let k2 = s.home(2).unwrap();
        assert_eq!(s.propose_move(&RB, &k2, &idle(3), |_| true), None);
        // Two more (the count decays a little): enough.
        s.record(1, 0, 0);
        s.record(1, 0, 0);
        assert_eq!(s.propose_move(&RB, &k2, &idle(3), |_| true), Some(1));
    }

    #[test]
    fn an_excess_already_taken_is_paid_back_by_a_move() {
        // Expected loads decay over 60 decisions, requests routed over 3000:
        // backend 0 took 200 requests of key 9 long ago, then keys 1, 2, 3
        // (homed on 0, 1, 2) share 300 evenly. The expected loads are even
        // now; only the requests taken say 0 ran hot.
        let run = |payback: f64| {
            let p = Placer::new(&backends(3), 20.0).with_payback(payback);
            {
                let mut s = p.lock();
                s.set_home(9, 0, false);
                for _ in 0..200 {
                    s.record(9, 0, 0);
                }
                for (key, at) in [(1u64, 0usize), (2, 1), (3, 2)] {
                    s.set_home(key, at, false);
                }
                for _ in 0..100 {
                    for (key, at) in [(1u64, 0usize), (2, 1), (3, 2)] {
                        s.record(key, at, 0);
                    }
                }
            }
            p
        };
        let loads = idle(3);
        let off = run(0.0);
        let s = off.lock();
        let k1 = s.home(1).unwrap();
        assert_eq!(s.propose_move(&RB, &k1, &loads, |_| true), None);
        let on = run(2.0);
        let s = on.lock();
        let k1 = s.home(1).unwrap();
        assert_eq!(s.propose_move(&RB, &k1, &loads, |_| true), Some(1));
        // Nothing of an under-served backend moves.
        let k2 = s.home(2).unwrap();
        assert_eq!(s.propose_move(&RB, &k2, &loads, |_| true), None);
        // The payback term is capped at the mean expected load.
        let expected = s.homes.loads();
        let mean = expected.iter().sum::<f64>() / 3.0;
        let load = s.balance_load();
        assert!(load(0) - expected[0] <= mean * (1.0 + 1e-9), "{}", load(0));
        assert!(load(1) - expected[1] >= -mean * (1.0 + 1e-9));
        assert!(load(0) > expected[0]);
    }

    #[test]
    fn a_gap_wider_than_the_mean_still_takes_a_fair_sized_prefix() {
        // Backend 0 holds key 1 (100 requests) and key 2 (10); 1 and 2 hold
        // nothing. D = 110, mean 37: key 1 is past 0.85 D and key 2 below
        // 0.15 D, yet key 2 is worth more than 15% of the mean.
        let p = Placer::new(&backends(3), 1e5);
        let mut s = p.lock();
        for (key, reqs) in [(1u64, 100), (2, 10)] {
            s.set_home(key, 0, false);
            for _ in 0..reqs {
                s.record(key, 0, 0);
            }
        }
        s.seq += 100;
        let loads = idle(3);
        let (k1, k2) = (s.home(1).unwrap(), s.home(2).unwrap());
        assert_eq!(s.propose_move(&RB, &k1, &loads, |_| true), None);
        assert_eq!(s.propose_move(&RB, &k2, &loads, |_| true), Some(1));
    }
}
