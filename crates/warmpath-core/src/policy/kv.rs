//! `kv_aware`: route each request by one cost formula over what every
//! backend actually caches, even the load by **moving** prefixes, and
//! **copy** a prefix too hot for one backend.
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
//! - `m_w`: the leading blocks of the chain `w` holds; when its agent is
//!   stale (silent past `ingest.stale_after_ms`, its engine still eligible),
//!   half of them, rounded up: a silent agent is not
//!   an empty cache; `queued_w`: the uncached blocks of the requests routed there
//!   that have not produced a first byte (the router's own prediction).
//! - `write_w`, the blocks `w` must newly cache: at the prefix's **home**
//!   (where it was placed) `B - m_w`; at any other backend all
//!   `B`, since a copy off the home is one to let age out (so a holder keeps
//!   its prefix unless its queue is a full prefill longer); and for a prefix
//!   no fresh backend holds `min_match_blocks` of (a **cold** one, the same
//!   `B` everywhere) `B + evict_w` where `w`'s capacity is known, else
//!   `B + pressure_w` (see [`place`](super::place)).
//! - `evict_w`, the **eviction term**: the expected blocks of other prefixes
//!   that writing the chain into `w`'s cache loses. The router models each
//!   backend's cache ([`resident`](super::resident): an LRU over prefixes,
//!   fed by its own decisions, corrected by the index), so it knows what the
//!   engine's LRU would trim there; each victim `v` held there deliberately
//!   counts its trimmed blocks times `p_v / (p_v + p_x)`, the chance that
//!   it is asked for again before the new prefix `x` (popularities from
//!   [`home`](super::home)). It is 0 where the chain fits, or where only
//!   stale copies go. A new prefix thus lands where it fits, else where it
//!   evicts the coldest: one cold prefill now instead of a miss for every
//!   return of a hotter prefix. Two refinements make LRU engines keep the
//!   hottest prefixes, as a pinned cache would ([`place`](super::place)): a
//!   **tail** prefix, less popular than the admission threshold (the `k`-th
//!   most popular prefix, `k` the prefixes the caches hold beyond
//!   one backend's worth), goes, among backends as good, to the
//!   one writing the most (not the lowest `E_w`), so the tail churns on its
//!   own caches; any other prefix adds to `evict_w` the
//!   **turnover term** `B * exp(-p_x * C_w / P_w)`, what `w`'s LRU would
//!   trim of it before it returns (`C_w` the capacity, `P_w` the decayed
//!   writes there), so a kept prefix avoids a churning cache.
//! - `pressure_w`, where the capacity is unknown: the blocks `w` wrote
//!   lately, decayed over `PRESSURE_WINDOW` decisions per backend: a new
//!   prefix lands where the cache turns over slowest (the proxy the
//!   eviction term replaces).
//!
//! A prefix no backend holds whose CHWBL ring owner (the prefix-hash home)
//! reports a **partial** view (its agent knows fewer blocks than its engine
//! uses) goes to that owner (`prefix_hash`): its missing blocks are unknown,
//! not absent, and the ring owner is where the prefix went before.
//!
//! The lowest cost wins; ties go to the deeper match, then at random (one
//! draw over the tied set; among a copied prefix's holders from the rng
//! salted by the decision count, since shared decisions seed it by the
//! prefix key and a fixed draw would starve the copies). Only the chain's holders are costed one by one;
//! the others cost by their load alone and are taken from load buckets
//! ([`candidates`](super::candidates)), the same decision as a scan. This
//! is the shape of Dynamo's KV router cost (prefill blocks to compute plus
//! decode load), with the cache's own cost added.
//!
//! ## Balance: the same costs, then the expected load
//!
//! Below saturation no in-flight bound binds, so a backend's share of the
//! traffic is the popularity of the prefixes homed on it. Each backend's
//! **expected load** `E_w` is the summed decayed popularity of the prefixes
//! homed there ([`home`](super::home)). It enters at the two points where
//! cost alone does not decide:
//!
//! - **cold**: every backend within `B` of the lowest cost, and
//!   within `FIT_BAND * B` of the lowest `evict_w`, is equally good, and the
//!   lowest `E_w` among them wins (then ring order);
//! - **too hot, at a holder**: a prefix whose popularity per holder, `p / k`,
//!   exceeds `(1 + COPY_SLACK * rebalance_slack)` times the mean `E`
//!   (`COPY_SLACK` = 0.75: room for the holder's other homes) cannot be
//!   served by its `k` holders within an even share: its request goes to the backend
//!   with the lowest cold cost (the eviction term included) among the
//!   others, which becomes a deliberate **copy** (decision `replicate`).
//!   So a prefix gets `k = ceil(p / ((1 + COPY_SLACK * rebalance_slack) E))` holders,
//!   one more per request of it, as many as its demand and the fleet need
//!   (at most every usable backend), once it brought `COPY_WARMUP` of its
//!   own requests per holder (see [`rebalance`](super::rebalance)). Its
//!   popularity then counts `p / k` on each
//!   holder, every holder is charged only what it lacks, so its traffic
//!   splits among them by the formula's load terms. When `p / (k - 1)` falls to the mean or below, the last
//!   copy is dropped (it ages out there). With `rebalance_slack: null`
//!   nothing is copied.
//!
//! A prefix's home is never moved to even the loads: that cost TTFT p90 and
//! bought only even shares (docs/kv.md).
//!
//! Every constant of the formula and the balance is named, with why it has
//! its value, in [`tuning`](super::tuning), beside the six knobs (two of a
//! data structure's own mechanics live beside it; see there).
//!
//! A cold placement is followed while its first request prefills there.
//! With `cold_placement: ring` a cold prefix goes by CHWBL on the prefix
//! key instead and there are no homes (several router replicas then agree).
//!
//! Decision: `replicate` when a request starts a copy; `kv_match` when the
//! winner holds the deepest match; `spill` when
//! a deeper-matching backend was passed over for load, or a
//! cold prefix was placed off its ring owner; `prefix_hash` when a cold
//! prefix went to its ring owner or followed its first request;
//! `least_outstanding` when every backend is full and the pick has the
//! fewest in flight.
//!
//! ## Every backend full
//!
//! When every eligible backend is at `concurrency_threshold` the gate is
//! lifted, not the formula: the warm pick costs the eligible backends that
//! hold part of the chain (a scan; the home and its copies charged only what
//! they lack; nothing is copied; a cold prefill elsewhere would add
//! work to a full fleet), and a cold prefix is placed as above over every
//! eligible backend. Falling back to least in flight instead ignores the caches: at
//! saturation its cold prefills make every backend slower, so they stay
//! full (a metastable overload the `scale` model showed at Zipf 1.5). The
//! decision is the formula's kind unless the pick also has the fewest in
//! flight (then `least_outstanding`, as before).

use super::candidates::{cheapest_scan, Held, Salted};
use super::home::Home;
use super::place::{Placed, Placer, State};
use super::rebalance::Rebalance;
use super::ring::PrefixAware;
use super::tuning::{ColdPlacement, KvConfig, PRESSURE_WINDOW};
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
    fallback: PrefixAware,
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
            fallback: PrefixAware::new(config, backends),
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

    /// Matched blocks of the backends that hold part of the chain, a stale
    /// one's halved, rounded up (the others match 0). Half: its agent went
    /// silent, not its engine (an engine that fails its probes is not
    /// eligible), so what it last published is likely still cached but less
    /// sure than a fresh view; half keeps a warm prefix on its old holder
    /// over cold backends, while a fresh holder of more than half the chain
    /// wins over it (issue 17).
    fn held(&self, input: &RouteInput<'_>) -> Held {
        let Some(m) = input.matches else {
            return Held::default();
        };
        let mut v: Vec<(u32, u32)> = m
            .workers
            .iter()
            .filter_map(|x| {
                let pos = self.position(x.slot)?;
                let blocks = if x.fresh {
                    x.blocks
                } else {
                    x.blocks.div_ceil(2)
                };
                (blocks > 0).then_some((pos as u32, blocks))
            })
            .collect();
        v.sort_unstable();
        // One match per position (an index lists a worker once).
        v.dedup_by_key(|e| e.0);
        Held(v)
    }

    /// Whether position `i` may take a request: eligible and below the
    /// concurrency threshold (as the candidates last synced it).
    fn usable(s: &State, i: usize) -> bool {
        s.cands.usable(i)
    }

    /// A prefix no fresh eligible backend holds (module docs).
    fn place_cold(
        &self,
        s: &mut State,
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
        let band = f64::from(input.chain_blocks);
        s.resident.sync(loads);
        self.observe(s, input, loads);
        let placed = s.place(
            input.prefix_key,
            input.chain_blocks,
            loads,
            |i| s.cands.usable(i),
            ring,
            weights,
            band,
        );
        let (backend, kind) = match placed {
            Some((b, Placed::Pressure)) => (b, DecisionKind::Cold),
            Some((b, Placed::RingOwner | Placed::Remembered)) => (b, DecisionKind::PrefixHash),
            // Every backend is full: the same placement, the gate lifted
            // (least_outstanding alone would ignore the caches and keep them
            // full with cold prefills).
            None => match s.place(
                input.prefix_key,
                input.chain_blocks,
                loads,
                |i| loads.get(i).is_some_and(|l| l.eligible),
                ring,
                weights,
                band,
            ) {
                Some((b, Placed::Pressure)) => (b, full_kind(loads, b, DecisionKind::Cold)),
                Some((b, Placed::RingOwner | Placed::Remembered)) => {
                    (b, full_kind(loads, b, DecisionKind::PrefixHash))
                }
                None => (
                    least_loaded(loads, rng).ok_or(PolicyError::NoBackend)?,
                    DecisionKind::LeastOutstanding,
                ),
            },
        };
        s.set_home(input.prefix_key, backend);
        s.record(input.prefix_key, backend, input.chain_blocks);
        s.cached(input.prefix_key, backend, input.chain_blocks);
        Ok(Decision {
            backend,
            kind,
            matched_blocks: 0,
        })
    }

    /// The warm pick under `pressure` placement: the cheapest backend (the
    /// home and its copies charged only for what they lack), and possibly
    /// one more copy of a prefix too hot for its holders (module docs).
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
        let home: Option<Home> = s.home(key).filter(|h| Self::usable(s, h.backend as usize));
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
        // The home and its deliberate copies that hold the prefix.
        let mut homes: Vec<usize> = holding.map_or_else(Vec::new, |h| {
            s.homes
                .holders(&h)
                .filter(|&i| i == at(&h) || (Self::usable(s, i) && holds(i)))
                .collect()
        });
        // Sorted: the pick looks each backend up in it.
        homes.sort_unstable();
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
            let eligible = |i: usize| loads.get(i).is_some_and(|l| l.eligible);
            let mut homes: Vec<usize> = s
                .home(key)
                .filter(|h| eligible(at(h)) && holds(at(h)))
                .map_or_else(Vec::new, |h| {
                    s.homes
                        .holders(&h)
                        .filter(|&i| eligible(i) && holds(i))
                        .collect()
                });
            homes.sort_unstable();
            let (m, backend) = self.cheapest_full(chain, held, &homes, loads, rng)?;
            s.record(key, backend, input.chain_blocks.saturating_sub(m));
            s.cached(key, backend, input.chain_blocks);
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
        held: &Held,
        loads: &[BackendLoad],
    ) -> Option<Decision> {
        let weights = (
            self.kv.prefill_weight,
            self.kv.miss_weight,
            self.kv.decode_weight,
        );
        let band = f64::from(input.chain_blocks);
        let mut holders: Vec<usize> = s.homes.holders(home).collect();
        holders.sort_unstable();
        let (t, _) = s.place(
            input.prefix_key,
            input.chain_blocks,
            loads,
            |i| s.cands.usable(i) && holders.binary_search(&i).is_err(),
            self.fallback.ring(),
            weights,
            band,
        )?;
        s.copy(input.prefix_key, Some(t));
        s.record(
            input.prefix_key,
            t,
            input.chain_blocks.saturating_sub(held.get(t)),
        );
        s.cached(input.prefix_key, t, input.chain_blocks);
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
    /// Under `ring` placement it keeps no homes: `None`.
    fn home_of(&self, prefix_key: u64) -> Option<super::HomeView> {
        self.homed()
            .then(|| super::remote::home_of(&self.placer, prefix_key))
            .flatten()
    }

    /// Under `ring` placement it keeps nothing to record.
    fn observe_remote(&self, decision: &super::RemoteDecision) {
        if self.homed() {
            super::remote::observe(&self.placer, decision);
        }
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
    /// Whether it keeps homes (`pressure` placement; `ring` keeps nothing).
    fn homed(&self) -> bool {
        self.kv.cold_placement == ColdPlacement::Pressure
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
            // A partial view's missing blocks are unknown, not absent: the
            // prefix's ring owner may hold it from before its agent's view.
            // (Looked up only when some view is partial: no cost, and no
            // draw from `rng`, otherwise.)
            let partial = |l: &BackendLoad| l.engine.is_some_and(|e| e.partial);
            if s.cands.any_partial() {
                let owner = self.fallback.pick_by_key(input.prefix_key, loads, rng)?;
                if loads.get(owner.backend).is_some_and(partial) {
                    return Ok(owner);
                }
            }
            return self.place_cold(&mut s, input, loads, rng);
        }
        if self.kv.cold_placement == ColdPlacement::Pressure {
            return self.pick_homed(&mut s, input, &held, best_match, loads, rng);
        }
        let chain = input.chain_blocks.max(best_match);
        let Some((m, backend)) = s.cands.cheapest(&self.kv, chain, &held, &[], rng) else {
            let (m, backend) = self.cheapest_full(chain, &held, &[], loads, rng)?;
            return Ok(full_decision(loads, backend, m, best_match));
        };
        Ok(warm_decision(backend, m, best_match))
    }

    /// The warm pick when every backend is full: the cost formula, the
    /// concurrency gate lifted, over the eligible holders of the chain (over
    /// every eligible backend when none holds it; module docs).
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
