//! `kv_aware`: one cost formula over what each backend caches, queued prefill and load,
//! with cold placement and copies. The formula, mechanisms and decisions: docs/kv.md.

use super::candidates::{cheapest_scan, Held, Salted};
use super::home::Home;
use super::place::{Placed, Placer, State};
use super::rebalance::Rebalance;
use super::ring::Ring;
use super::tuning::{KvConfig, PRESSURE_WINDOW};
use crate::error::PolicyError;
use crate::route::{
    least_loaded, BackendLoad, Built, Decision, DecisionKind, Learns, Loads, Policy, PolicyBackend,
    PolicyConfig, RouteInput, Strategy,
};
use rand::RngCore;
use warmpath_index::WorkerSlot;

#[derive(Debug)]
pub struct KvAware {
    /// Worker ids: a rebuild carries state by them.
    ids: Vec<String>,
    slots: Vec<WorkerSlot>,
    /// Index slot -> position (`u32::MAX`: not in the snapshot).
    pos_of: Vec<u32>,
    /// Cold placement's tie order (and what `prefix_hash` names).
    ring: Ring,
    placer: Placer,
    rebalance: Option<Rebalance>,
    kv: KvConfig,
}

impl KvAware {
    pub fn new(config: &PolicyConfig, backends: &[PolicyBackend]) -> Self {
        let slots = backends.iter().map(|b| b.slot as usize + 1).max();
        let mut pos_of = vec![u32::MAX; slots.unwrap_or(0)];
        for (i, b) in backends.iter().enumerate().rev() {
            pos_of[b.slot as usize] = i as u32;
        }
        KvAware {
            ids: backends.iter().map(|b| b.id.clone()).collect(),
            slots: backends.iter().map(|b| b.slot).collect(),
            pos_of,
            ring: Ring::new(backends, config.vnodes),
            placer: Placer::new(backends, PRESSURE_WINDOW)
                .with_candidates(&config.kv, config.concurrency_threshold),
            rebalance: config.kv.rebalance_slack.map(|slack| Rebalance {
                slack,
                backends: backends.len() as u64,
            }),
            kv: config.kv.clone(),
        }
    }

    /// Decaying over `window` decisions per backend (tests keep counts exact with a long one).
    #[cfg(test)]
    fn with_window(config: &PolicyConfig, backends: &[PolicyBackend], window: f64) -> Self {
        let placer = Placer::new(backends, window);
        KvAware {
            placer: placer.with_candidates(&config.kv, config.concurrency_threshold),
            ..Self::new(config, backends)
        }
    }

    fn carried_over(&self, config: &PolicyConfig, backends: &[PolicyBackend]) -> Self {
        let next = KvAware::new(config, backends);
        let old = self.placer.lock();
        next.placer.lock().carry(&old, &self.ids, backends);
        next
    }

    fn position(&self, slot: WorkerSlot) -> Option<usize> {
        self.pos_of
            .get(slot as usize)
            .filter(|&&p| p != u32::MAX)
            .map(|&p| p as usize)
    }

    /// Matched blocks of the chain's holders, a stale agent's as it last published them.
    fn held(&self, input: &RouteInput<'_>) -> Held {
        let Some(m) = input.matches else {
            return Held::default();
        };
        let mut v: Vec<(u32, u32)> = m
            .workers
            .iter()
            .filter_map(|x| Some((self.position(x.slot)? as u32, x.blocks)))
            .filter(|e| e.1 > 0)
            .collect();
        v.sort_unstable();
        // One match per position (an index lists a worker once).
        v.dedup_by_key(|e| e.0);
        Held(v)
    }

    fn place_cold(
        &self,
        s: &mut State,
        input: &RouteInput<'_>,
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let (key, blocks) = (input.prefix_key, input.chain_blocks);
        let (ring, weights, band) = (&self.ring, self.weights(), f64::from(blocks));
        let kind = |how| match how {
            Placed::Pressure => DecisionKind::Cold,
            Placed::RingOwner | Placed::Remembered => DecisionKind::PrefixHash,
        };
        let eligible = |i: usize| loads.get(i).is_some_and(|l| l.eligible);
        let usable = |i: usize| s.cands.usable(i);
        let (backend, kind) = if let Some((b, how)) =
            s.place(key, blocks, loads, usable, ring, weights, band)
        {
            (b, kind(how))
        } else if let Some((b, how)) = s.place(key, blocks, loads, eligible, ring, weights, band) {
            // Every backend is full: the same placement, the gate lifted.
            (b, least_or(loads, b, kind(how)))
        } else {
            let b = least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?;
            (b, DecisionKind::LeastOutstanding)
        };
        s.set_home(key, backend);
        s.sent(key, backend, blocks, 0);
        Ok(decision(backend, 0, kind))
    }

    /// The warm pick: the cheapest backend, or one more copy of a prefix too hot for its holders.
    fn pick_homed(
        &self,
        s: &mut State,
        input: &RouteInput<'_>,
        held: &Held,
        best_match: u32,
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let key = input.prefix_key;
        let chain = input.chain_blocks.max(best_match);
        // A shallower match (or none) won on load, or the deeper holders were full: spill.
        let kind = |m| {
            if m == best_match {
                DecisionKind::KvMatch
            } else {
                DecisionKind::Spill
            }
        };
        let home: Option<Home> = s.home(key).filter(|h| s.cands.usable(h.backend as usize));
        let at = |h: &Home| h.backend as usize;
        let holds = |i: usize| held.get(i) >= best_match;
        let holding = home.filter(|h| holds(at(h)));
        // Its agent's view is stale: it may well hold it; re-home nothing.
        let of = |h: Home| input.matches.and_then(|m| m.of(self.slots[at(&h)]));
        let stale = home.and_then(of).is_some_and(|w| !w.fresh);
        // The home and its copies that pass `ok` and hold the deepest match, sorted.
        let holders_by = |ok: &dyn Fn(usize) -> bool| -> Vec<usize> {
            let mut v: Vec<usize> = s
                .home(key)
                .filter(|h| ok(at(h)) && holds(at(h)))
                .map_or_else(Vec::new, |h| {
                    s.homes.holders(&h).filter(|&i| ok(i) && holds(i)).collect()
                });
            v.sort_unstable();
            v
        };
        let homes = holders_by(&|i| s.cands.usable(i));
        // A salted rng: under shared decisions the caller's rng is seeded by the prefix key
        // (`route::pick`), so every tie would draw the same holder and a copy get no traffic.
        let cheapest = if homes.len() > 1 {
            let mut salted = Salted {
                inner: rng,
                salt: s.seq,
            };
            s.cands.cheapest(&self.kv, chain, held, &homes, &mut salted)
        } else {
            s.cands.cheapest(&self.kv, chain, held, &homes, rng)
        };
        let Some((m, backend)) = cheapest else {
            // Every backend is full: the same formula over the eligible ones; nothing is copied.
            let homes = holders_by(&|i| loads.get(i).is_some_and(|l| l.eligible));
            let (m, backend) = self.cheapest_full(chain, held, &homes, loads, rng)?;
            s.sent(key, backend, input.chain_blocks, m);
            return Ok(decision(backend, m, least_or(loads, backend, kind(m))));
        };
        match (holding, &self.rebalance) {
            (Some(h), Some(rb)) if homes.contains(&backend) && m == best_match => {
                match s.replicas(rb, &h, |i| s.cands.usable(i)) {
                    Some(true) => {
                        if let Some(d) = self.replicate(s, input, &h, held, loads) {
                            return Ok(d);
                        }
                    }
                    Some(false) => s.copy(key, None),
                    None => {}
                }
            }
            // Its home lost it (or it had none): it lives where it went.
            (None, _) if !stale && home.is_none_or(|h| at(&h) != backend) => {
                s.set_home(key, backend);
            }
            _ => {}
        }
        s.sent(key, backend, input.chain_blocks, m);
        Ok(decision(backend, m, kind(m)))
    }

    /// One more copy of `home`'s prefix: the lowest cold cost among the backends not holding it.
    fn replicate(
        &self,
        s: &mut State,
        input: &RouteInput<'_>,
        home: &Home,
        held: &Held,
        loads: &[BackendLoad],
    ) -> Option<Decision> {
        let mut holders: Vec<usize> = s.homes.holders(home).collect();
        holders.sort_unstable();
        let (t, _) = s.place(
            input.prefix_key,
            input.chain_blocks,
            loads,
            |i| s.cands.usable(i) && holders.binary_search(&i).is_err(),
            &self.ring,
            self.weights(),
            f64::from(input.chain_blocks),
        )?;
        s.copy(input.prefix_key, Some(t));
        s.sent(input.prefix_key, t, input.chain_blocks, held.get(t));
        Some(decision(t, held.get(t), DecisionKind::Replicate))
    }

    /// Feeds the index's fresh view of this prefix into the resident model.
    fn observe(&self, s: &mut State, input: &RouteInput<'_>, loads: &[BackendLoad]) {
        let Some(m) = input.matches.filter(|_| s.resident.any()) else {
            return;
        };
        let key = input.prefix_key;
        for w in m.workers.iter().filter(|w| w.fresh) {
            if let Some(i) = self.position(w.slot) {
                s.observe(key, i, w.blocks, loads);
            }
        }
        // An unlisted home holds none of it.
        let home = s.home(key).map(|h| h.backend as usize);
        if let Some(i) = home.filter(|&i| self.slots.get(i).is_some_and(|x| m.of(*x).is_none())) {
            s.observe(key, i, 0, loads);
        }
    }

    fn weights(&self) -> (f64, f64, f64) {
        let k = &self.kv;
        (k.prefill_weight, k.miss_weight, k.decode_weight)
    }

    /// The warm pick when every backend is full: the formula over the eligible holders, if any.
    fn cheapest_full(
        &self,
        chain: u32,
        held: &Held,
        homes: &[usize],
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<(u32, usize), PolicyError> {
        let matched: Vec<u32> = (0..loads.len()).map(|i| held.get(i)).collect();
        // A full fleet gains nothing from a cold prefill off the holders: capacity lost.
        let holders: Vec<BackendLoad> = loads
            .iter()
            .zip(&matched)
            .map(|(l, &m)| BackendLoad {
                eligible: l.eligible && m > 0,
                ..*l
            })
            .collect();
        let scope = if holders.iter().any(|l| l.eligible) {
            &holders[..]
        } else {
            loads
        };
        cheapest_scan(&self.kv, u32::MAX, chain, &matched, scope, homes, rng)
            .ok_or(PolicyError::NoBackend)
    }
}

impl Policy for KvAware {
    fn build(snapshot: &[PolicyBackend], config: &PolicyConfig) -> Result<Self, PolicyError> {
        Ok(KvAware::new(config, snapshot))
    }

    fn pick(
        &self,
        input: &RouteInput<'_>,
        loads: &Loads<'_>,
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let (changed, loads) = (loads.changed, loads.all);
        let held = self.held(input);
        let mut s = self.placer.state(input.mode);
        s.cands.sync(loads, changed);
        s.resident.note(loads, changed);
        if !s.cands.any_eligible() {
            return Err(PolicyError::NoBackend);
        }
        let best_match = held
            .iter()
            .filter(|&(i, _)| loads.get(i).is_some_and(|l| l.eligible))
            .map(|(_, m)| m)
            .max()
            .unwrap_or(0);
        s.resident.sync(loads);
        self.observe(&mut s, input, loads);
        if best_match < self.kv.min_match_blocks {
            return self.place_cold(&mut s, input, loads, rng);
        }
        self.pick_homed(&mut s, input, &held, best_match, loads, rng)
    }
}

impl Learns for KvAware {
    fn home_of(&self, prefix_key: u64) -> Option<crate::route::HomeView> {
        let s = self.placer.lock();
        s.home(prefix_key).map(|h| s.view(&h))
    }

    fn observe_remote(&self, decision: &crate::route::RemoteDecision) {
        self.placer.lock().observe_remote(decision);
    }

    /// Carries state over by worker id (the `carry` module); the ring is rebuilt.
    fn carried(
        &self,
        snapshot: &[PolicyBackend],
        config: &PolicyConfig,
    ) -> Result<Built, PolicyError> {
        config.validate()?;
        let next = self.carried_over(config, snapshot);
        Ok(Built::learning(Strategy::KvAware, next))
    }
}

/// `kind`, or `least_outstanding` when (every backend full) the pick has the fewest in flight.
fn least_or(loads: &[BackendLoad], backend: usize, kind: DecisionKind) -> DecisionKind {
    let min = loads
        .iter()
        .filter(|l| l.eligible)
        .map(BackendLoad::effective_in_flight)
        .min();
    let least = loads
        .get(backend)
        .is_some_and(|l| Some(l.effective_in_flight()) == min);
    if least {
        DecisionKind::LeastOutstanding
    } else {
        kind
    }
}

fn decision(backend: usize, matched_blocks: u32, kind: DecisionKind) -> Decision {
    Decision {
        backend,
        kind,
        matched_blocks,
    }
}

#[cfg(test)]
#[path = "kv_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "kv_preview_tests.rs"]
mod preview_tests;

#[cfg(test)]
#[path = "kv_carry_tests.rs"]
mod carry_tests;
