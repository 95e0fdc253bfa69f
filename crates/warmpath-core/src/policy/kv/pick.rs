//! `kv_aware`'s pick: the pipeline's driver, and what the policy does beyond picking
//! ([`Learns`]: homes, other replicas' decisions, carry-over).

use super::candidates::Held;
use super::tuning::PRESSURE_WINDOW;
use super::{balance, choose, place, KvAware, Rehome, State};
use crate::error::PolicyError;
use crate::policy::ring::Ring;
use crate::route::{
    BackendLoad, Built, Decision, HomeView, Learns, Loads, Mode, Policy, PolicyBackend,
    PolicyConfig, RemoteDecision, RouteInput, Strategy,
};
use rand::RngCore;
use warmpath_index::WorkerSlot;

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
            placer: State::new(backends, PRESSURE_WINDOW)
                .with_candidates(&config.kv, config.concurrency_threshold),
            kv: config.kv.clone(),
        }
    }

    /// Decaying over `window` decisions per backend (tests keep counts exact with a long one).
    #[cfg(test)]
    pub(super) fn with_window(
        config: &PolicyConfig,
        backends: &[PolicyBackend],
        window: f64,
    ) -> Self {
        let state = State::new(backends, window);
        KvAware {
            placer: state.with_candidates(&config.kv, config.concurrency_threshold),
            ..Self::new(config, backends)
        }
    }

    pub(super) fn carried_over(&self, config: &PolicyConfig, backends: &[PolicyBackend]) -> Self {
        let (next, old) = (KvAware::new(config, backends), self.placer.lock());
        next.placer.lock().carry(&old, &self.ids, backends);
        next
    }

    fn position(&self, slot: WorkerSlot) -> Option<usize> {
        self.pos_of
            .get(slot as usize)
            .filter(|&&p| p != u32::MAX)
            .map(|&p| p as usize)
    }

    /// `score`: matched blocks of the chain's holders, a stale agent's as it last published them.
    pub(super) fn held(&self, input: &RouteInput<'_>) -> Held {
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

    /// `score` → `place` | `choose` → `balance` → `commit` (not under a preview).
    fn pipeline(
        &self,
        s: &mut State,
        input: &RouteInput<'_>,
        loads: &Loads<'_>,
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let (changed, loads) = (loads.changed, loads.all);
        let held = self.held(input);
        if !s.refresh(loads, changed) {
            return Err(PolicyError::NoBackend);
        }
        self.observe(s, input, loads);
        let eligible = |i: usize| loads.get(i).is_some_and(|l| l.eligible);
        let best_match = held
            .iter()
            .filter(|&(i, _)| eligible(i))
            .map(|(_, m)| m)
            .max();
        let best_match = best_match.unwrap_or(0);
        let step = if best_match < self.kv.min_match_blocks {
            place::cold(self, s, input, loads, rng)?
        } else {
            let (step, copyable) = choose::warm(self, s, input, &held, best_match, loads, rng)?;
            balance::copies(self, s, input, &held, loads, step, copyable)
        };
        if input.mode == Mode::Commit {
            let (d, chain) = (&step.decision, input.chain_blocks);
            let prefill = chain.saturating_sub(d.matched_blocks);
            s.commit(input.prefix_key, d.backend, chain, prefill, step.rehome);
        }
        Ok(step.decision)
    }

    pub(super) fn weights(&self) -> (f64, f64, f64) {
        let k = &self.kv;
        (k.prefill_weight, k.miss_weight, k.decode_weight)
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
        let mut s = self.placer.lock();
        let saved = (input.mode == Mode::Preview).then(|| s.save());
        let picked = self.pipeline(&mut s, input, loads, rng);
        if let Some(saved) = saved {
            s.restore(saved);
        }
        picked
    }
}

impl Learns for KvAware {
    fn home_of(&self, prefix_key: u64) -> Option<HomeView> {
        let s = self.placer.lock();
        s.home(prefix_key).map(|h| s.view(&h))
    }

    /// Another replica's pick goes through the same commit as this one's, with the sender's
    /// home and copies: state, not the rule that fired, so the next corrects a lost one.
    fn observe_remote(&self, d: &RemoteDecision) {
        let mut s = self.placer.lock();
        let n = s.homes.loads().len();
        if d.backend >= n {
            return;
        }
        let rehome = match &d.home {
            Some(h) if h.backend < n => Rehome::Align(h.clone()),
            _ => Rehome::Keep,
        };
        let (key, chain) = (d.prefix_key, d.chain_blocks);
        s.commit(key, d.backend, chain, d.prefill_blocks, rehome);
    }

    /// Carries state over by worker id; the ring is rebuilt.
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
