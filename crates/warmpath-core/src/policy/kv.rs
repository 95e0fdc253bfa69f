//! `kv_aware`: one cost formula over what each backend actually caches,
//! queued prefill and load; a prefix cached nowhere goes where writing it
//! evicts least, and a prefix too hot for its holders gets copies. The
//! formula, its terms and what each mechanism earns: docs/kv.md. Only the
//! chain's holders are costed one by one; the others come from load
//! buckets ([`candidates`](super::candidates)). With every backend full the
//! concurrency gate is lifted, not the formula.
//!
//! Decision: `replicate` when a request starts a copy; `kv_match` when the
//! winner holds the deepest match; `spill` when a deeper-matching backend was
//! passed over; `cold` when a cold prefix was placed off its ring owner;
//! `prefix_hash` when it went to its ring owner or followed its first
//! request; `least_outstanding` when every backend is full and the pick has
//! the fewest in flight.

use super::candidates::{cheapest_scan, Held, Salted};
use super::home::Home;
use super::place::{Placed, Placer, State};
use super::rebalance::Rebalance;
use super::ring::Ring;
use super::tuning::{KvConfig, PRESSURE_WINDOW};
use super::{
    least_loaded, BackendLoad, Built, Decision, DecisionKind, Learns, Loads, Policy, PolicyBackend,
    PolicyConfig, PolicyError, RouteInput, Strategy,
};
use rand::RngCore;
use warmpath_index::WorkerSlot;

/// The KV-aware policy.
#[derive(Debug)]
pub struct KvAware {
    /// Worker ids, in snapshot order: a rebuild carries state by them.
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
    /// Builds over `backends` (their index slots map matches to positions).
    pub fn new(config: &PolicyConfig, backends: &[PolicyBackend]) -> Self {
        Self::with_window(config, backends, PRESSURE_WINDOW)
    }

    /// With pressure and popularity decaying over `window` decisions per
    /// backend (tests use a long one to keep counts exact).
    fn with_window(config: &PolicyConfig, backends: &[PolicyBackend], window: f64) -> Self {
        let mut pos_of = vec![
            u32::MAX;
            backends
                .iter()
                .map(|b| b.slot as usize + 1)
                .max()
                .unwrap_or(0)
        ];
        for (i, b) in backends.iter().enumerate().rev() {
            pos_of[b.slot as usize] = i as u32;
        }
        KvAware {
            ids: backends.iter().map(|b| b.id.clone()).collect(),
            slots: backends.iter().map(|b| b.slot).collect(),
            pos_of,
            ring: Ring::new(backends, config.vnodes),
            placer: Placer::new(backends, window)
                .with_candidates(&config.kv, config.concurrency_threshold),
            rebalance: config.kv.rebalance_slack.map(|slack| Rebalance {
                slack,
                backends: backends.len() as u64,
            }),
            kv: config.kv.clone(),
        }
    }

    /// A policy over `backends` that takes this one's state over
    /// ([`Learns::carried`]).
    fn carried_over(&self, config: &PolicyConfig, backends: &[PolicyBackend]) -> Self {
        let next = KvAware::new(config, backends);
        let mut state = self.placer.lock().remap(&self.ids, backends);
        let mut live = next.placer.lock();
        // The new config's candidate weights, not the old policy's.
        std::mem::swap(&mut state.cands, &mut live.cands);
        *live = state;
        drop(live);
        next
    }

    /// The position of index slot `slot`, if in the snapshot.
    fn position(&self, slot: WorkerSlot) -> Option<usize> {
        self.pos_of
            .get(slot as usize)
            .filter(|&&p| p != u32::MAX)
            .map(|&p| p as usize)
    }

    /// Matched blocks of the backends that hold part of the chain (the
    /// others match 0), a stale agent's as it last published them.
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

    /// A prefix no eligible backend holds (docs/kv.md).
    fn place_cold(
        &self,
        s: &mut State,
        input: &RouteInput<'_>,
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let weights = self.weights();
        let ring = &self.ring;
        let band = f64::from(input.chain_blocks);
        s.resident.sync(loads);
        self.observe(s, input, loads);
        let key = input.prefix_key;
        let blocks = input.chain_blocks;
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
            // Every backend is full: the same placement, the gate lifted
            // (least_outstanding alone would ignore the caches and keep
            // them full with cold prefills).
            (b, full_kind(loads, b, kind(how)))
        } else {
            let b = least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?;
            (b, DecisionKind::LeastOutstanding)
        };
        s.set_home(key, backend);
        s.sent(key, backend, blocks, 0);
        Ok(Decision {
            backend,
            kind,
            matched_blocks: 0,
        })
    }

    /// The warm pick: the cheapest backend (the home and its copies charged
    /// only for what they lack), and possibly one more copy of a prefix too
    /// hot for its holders (docs/kv.md).
    #[allow(clippy::too_many_arguments)]
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
        s.resident.sync(loads);
        self.observe(s, input, loads);
        let home: Option<Home> = s.home(key).filter(|h| s.cands.usable(h.backend as usize));
        let at = |h: &Home| h.backend as usize;
        // The home holds it: the deepest match.
        let holds = |i: usize| held.get(i) >= best_match;
        let holding = home.filter(|h| holds(at(h)));
        // Its agent's view is stale: it may well hold it; decide nothing.
        let stale = home.is_some_and(|h| {
            let slot = self.slots[at(&h)];
            input
                .matches
                .and_then(|m| m.of(slot))
                .is_some_and(|w| !w.fresh)
        });
        // The home and its deliberate copies that pass `ok` and hold the
        // deepest match (none unless the home does), sorted: the pick looks
        // each backend up in it.
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
        // Ties among a copied prefix's holders draw from a salted rng: under
        // shared decisions the caller's rng is seeded by the prefix key
        // (`route::pick`), so every request would draw the same holder and a
        // copy would get none of the traffic at equal load.
        let cheapest = if homes.len() > 1 {
            let mut salted = Salted::new(rng, s.seq);
            s.cands.cheapest(&self.kv, chain, held, &homes, &mut salted)
        } else {
            s.cands.cheapest(&self.kv, chain, held, &homes, rng)
        };
        let Some((m, backend)) = cheapest else {
            // Every backend is full: the same formula over the eligible ones,
            // the home (and its copies) charged only what they lack; nothing
            // is copied.
            let homes = holders_by(&|i| loads.get(i).is_some_and(|l| l.eligible));
            let (m, backend) = self.cheapest_full(chain, held, &homes, loads, rng)?;
            s.sent(key, backend, input.chain_blocks, m);
            return Ok(full_decision(loads, backend, m, best_match));
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
        held: &Held,
        loads: &[BackendLoad],
    ) -> Option<Decision> {
        let weights = self.weights();
        let band = f64::from(input.chain_blocks);
        let mut holders: Vec<usize> = s.homes.holders(home).collect();
        holders.sort_unstable();
        let (t, _) = s.place(
            input.prefix_key,
            input.chain_blocks,
            loads,
            |i| s.cands.usable(i) && holders.binary_search(&i).is_err(),
            &self.ring,
            weights,
            band,
        )?;
        s.copy(input.prefix_key, Some(t));
        s.sent(input.prefix_key, t, input.chain_blocks, held.get(t));
        Some(Decision {
            backend: t,
            kind: DecisionKind::Replicate,
            matched_blocks: held.get(t),
        })
    }

    /// Feeds the index's fresh view of this prefix into the resident model:
    /// what each listed holder has of the chain, and that the prefix's home,
    /// when not listed, has none of it.
    fn observe(&self, s: &mut State, input: &RouteInput<'_>, loads: &[BackendLoad]) {
        let Some(m) = input.matches else {
            return;
        };
        if !s.resident.any() {
            return;
        }
        let key = input.prefix_key;
        for w in m.workers.iter().filter(|w| w.fresh) {
            if let Some(i) = self.position(w.slot) {
                s.observe(key, i, w.blocks, loads);
            }
        }
        if let Some(h) = s.home(key) {
            let i = h.backend as usize;
            if self.slots.get(i).is_some_and(|slot| m.of(*slot).is_none()) {
                s.observe(key, i, 0, loads);
            }
        }
    }
}

impl Policy for KvAware {
    fn build(snapshot: &[PolicyBackend], config: &PolicyConfig) -> Result<Self, PolicyError> {
        Ok(KvAware::new(config, snapshot))
    }

    fn pick(
        &self,
        request: &RouteInput<'_>,
        loads: &Loads<'_>,
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        self.decide(request, loads.all, loads.changed, rng)
    }
}

impl Learns for KvAware {
    fn home_of(&self, prefix_key: u64) -> Option<super::HomeView> {
        super::remote::home_of(&self.placer, prefix_key)
    }

    fn observe_remote(&self, decision: &super::RemoteDecision) {
        super::remote::observe(&self.placer, decision);
    }

    /// Carries homes, popularity, pressure and the modelled
    /// caches over to the new snapshot by worker
    /// id (see the `carry` module); the ring is rebuilt (1/N of keys change owner).
    fn carried(
        &self,
        snapshot: &[PolicyBackend],
        config: &PolicyConfig,
    ) -> Result<Built, PolicyError> {
        config.validate()?;
        Ok(Built::learning(
            Strategy::KvAware,
            self.carried_over(config, snapshot),
        ))
    }
}

impl KvAware {
    /// The cost formula's weights: (prefill, miss, decode).
    fn weights(&self) -> (f64, f64, f64) {
        (
            self.kv.prefill_weight,
            self.kv.miss_weight,
            self.kv.decode_weight,
        )
    }

    /// The decision of [`Policy::pick`]; recorded only under `Mode::Commit`
    /// (see [`Placer::state`]).
    fn decide(
        &self,
        input: &RouteInput<'_>,
        loads: &[BackendLoad],
        changed: Option<&[usize]>,
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let held = self.held(input);
        let mut s = self.placer.state(input.mode);
        s.cands.sync(loads, changed);
        s.resident.note(loads, changed);
        if !s.cands.any_eligible() {
            return Err(PolicyError::NoBackend);
        }
        let eligible = |i: usize| loads.get(i).is_some_and(|l| l.eligible);
        let best_match = held
            .iter()
            .filter(|&(i, _)| eligible(i))
            .map(|(_, m)| m)
            .max()
            .unwrap_or(0);
        if best_match < self.kv.min_match_blocks {
            return self.place_cold(&mut s, input, loads, rng);
        }
        self.pick_homed(&mut s, input, &held, best_match, loads, rng)
    }

    /// The warm pick when every backend is full: the cost formula, the
    /// concurrency gate lifted, over the eligible holders of the chain (over
    /// every eligible backend when none holds it).
    fn cheapest_full(
        &self,
        chain: u32,
        held: &Held,
        homes: &[usize],
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<(u32, usize), PolicyError> {
        let matched: Vec<u32> = (0..loads.len()).map(|i| held.get(i)).collect();
        // A full fleet gains nothing from a cold prefill off the holders:
        // it is capacity lost, so only the eligible holders are costed.
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

/// With every backend full: `least_outstanding` when the formula's pick is
/// also a least-loaded backend (fewest in flight), else the formula's kind.
fn full_kind(loads: &[BackendLoad], backend: usize, kind: DecisionKind) -> DecisionKind {
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

/// A warm pick with every backend full ([`full_kind`] over
/// [`warm_decision`]).
fn full_decision(loads: &[BackendLoad], backend: usize, m: u32, best_match: u32) -> Decision {
    let d = warm_decision(backend, m, best_match);
    Decision {
        kind: full_kind(loads, backend, d.kind),
        ..d
    }
}

/// A pick among holders: kv_match when `backend` holds the deepest match
/// (`m == best_match`); a shallower one (or none) won on load, or because
/// the deeper holders were full: spill.
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
#[path = "kv_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "kv_preview_tests.rs"]
mod preview_tests;

#[cfg(test)]
#[path = "kv_carry_tests.rs"]
mod carry_tests;
