//! `kv_aware`: one cost formula over what each backend caches, queued prefill and load,
//! with cold placement and copies (docs/kv.md). Each pick ([`pick`]) is one pipeline:
//! `score` → `place` a cold prefix ([`place`]) or `choose` a warm backend ([`choose`]) →
//! `balance` copies ([`balance`]) → [`State::commit`]. The stages read the [`State`] and
//! return a [`Step`]; only this file changes the state, and a preview skips the commit.

mod balance;
mod candidates;
mod choose;
mod home;
mod pick;
mod place;
mod resident;
pub(crate) mod tuning;

use self::candidates::Candidates;
use self::home::{Home, Homes};
use self::resident::Resident;
use self::tuning::{home_table_keys, KvConfig, REUSE_BACKENDS, STICKY};
use super::ring::Ring;
use crate::route::{BackendLoad, Decision, DecisionKind, HomeView, PolicyBackend};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
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
    placer: Mutex<State>,
    kv: KvConfig,
}

/// What a stage decided: the pick, and what it changes of the prefix's home.
pub(crate) struct Step {
    decision: Decision,
    rehome: Rehome,
}

/// A change to a prefix's home and copies, made by [`State::commit`].
enum Rehome {
    Keep,
    /// Homed on this backend (again: its placement is recent once more).
    To(usize),
    Copy(usize),
    /// Its last copy dropped.
    Uncopy,
    /// As another replica has it.
    Align(HomeView),
}

/// Everything `kv_aware` learns, under one lock. Only this file changes it.
#[derive(Clone, Debug)]
pub(crate) struct State {
    /// Decayed blocks written per backend, in units of `unit`.
    pressure: Vec<f64>,
    /// The weight of the next decision (growing by 1/decay decays every past one).
    unit: f64,
    seq: u64,
    homes: Homes,
    /// Per decision: `1 - 1 / (window x backends)`.
    decay: f64,
    resident: Resident,
    /// The last admission threshold: (decision, prefix blocks, popularity).
    tail: Cell<Option<(u64, u32, f64)>>,
    cands: Candidates,
    fleet: Cell<Option<Fleet>>,
}

/// What a pick learns of loads (and its cached sums) which a preview puts back.
type Saved = (Candidates, Option<(u64, u32, f64)>, Option<Fleet>);

impl State {
    /// Decaying over `window` decisions per backend.
    fn new(backends: &[PolicyBackend], window: f64) -> Self {
        let n = backends.len().max(1);
        State {
            pressure: vec![0.0; backends.len()],
            unit: 1.0,
            seq: 0,
            homes: Homes::new(backends.len(), home_table_keys(n)),
            decay: 1.0 - 1.0 / (window * n as f64).max(1.0),
            resident: Resident::new(backends.iter().map(|b| b.capacity_blocks)),
            tail: Cell::new(None),
            cands: Candidates::new(backends.len(), 0.0, 0.0, u32::MAX),
            fleet: Cell::new(None),
        }
    }

    /// The warm pick's candidates weigh loads by `kv` and treat `threshold` in flight as full.
    fn with_candidates(mut self, kv: &KvConfig, threshold: u32) -> Mutex<Self> {
        let n = self.pressure.len();
        self.cands = Candidates::new(n, kv.prefill_weight, kv.decode_weight, threshold);
        Mutex::new(self)
    }

    fn save(&mut self) -> Saved {
        self.resident.begin();
        (self.cands.clone(), self.tail.get(), self.fleet.get())
    }

    fn restore(&mut self, (cands, tail, fleet): Saved) {
        self.cands = cands;
        self.tail.set(tail);
        self.fleet.set(fleet);
        self.resident.rollback();
    }

    pub(crate) fn home(&self, key: u64) -> Option<Home> {
        self.homes.get(key)
    }

    fn view(&self, h: &Home) -> HomeView {
        HomeView {
            backend: h.backend as usize,
            copies: self.homes.holders(h).skip(1).collect(),
        }
    }

    /// Records one decision, a local step's or another replica's: its home, then its request
    /// (`prefill` of its `chain` blocks written on `backend`).
    fn commit(&mut self, key: u64, backend: usize, chain: u32, prefill: u32, rehome: Rehome) {
        self.rehome(key, rehome);
        self.record(key, backend, prefill);
        self.cached(key, backend, chain);
    }

    fn rehome(&mut self, key: u64, rehome: Rehome) {
        if !matches!(rehome, Rehome::Keep) {
            // Homes change: the fleet summary is retaken.
            self.fleet.set(None);
        }
        match rehome {
            Rehome::Keep => {}
            Rehome::To(b) => self.homes.set_home(key, b, self.seq),
            Rehome::Copy(b) => self.homes.add_copy(key, b),
            Rehome::Uncopy => {
                self.homes.drop_copy(key);
            }
            Rehome::Align(h) => self.align(key, &h),
        }
    }

    /// What the pick learns of the loads (`changed`: which moved, if known) and capacities
    /// before its stages; `false` when no backend is eligible.
    fn refresh(&mut self, loads: &[BackendLoad], changed: Option<&[usize]>) -> bool {
        self.cands.sync(loads, changed);
        self.resident.note(loads, changed);
        let any = self.cands.any_eligible();
        if any {
            self.resident.sync(loads);
        }
        any
    }

    /// Takes another replica's home and copies of `key` as its own.
    fn align(&mut self, key: u64, h: &HomeView) {
        let n = self.homes.loads().len();
        if self.home(key).map(|l| l.backend as usize) != Some(h.backend) {
            self.homes.set_home(key, h.backend, self.seq);
        }
        let want: Vec<usize> = h.copies.iter().copied().filter(|&c| c < n).collect();
        let have = self.home(key).map(|l| self.view(&l).copies);
        if have.as_ref() != Some(&want) {
            while self.homes.drop_copy(key).is_some() {}
            for c in want {
                self.homes.add_copy(key, c);
            }
        }
    }

    /// Records a request of `key` sent to `backend`, which writes `blocks` into its cache.
    fn record(&mut self, key: u64, backend: usize, blocks: u32) {
        self.seq += 1;
        let unit = self.unit;
        if let Some(p) = self.pressure.get_mut(backend) {
            *p += unit * f64::from(blocks);
        }
        self.homes.hit(key, backend, unit, self.seq);
        self.unit /= self.decay;
        // Reset (everything divided by the unit) long before an f64 overflows.
        if self.unit > 1e200 {
            let k = self.unit;
            self.pressure.iter_mut().for_each(|p| *p /= k);
            self.homes.rescale(k);
            self.tail.set(None);
            self.unit = 1.0;
        }
    }

    fn cached(&mut self, key: u64, backend: usize, blocks: u32) {
        if let Some(c) = self.resident.of_mut(backend) {
            c.store(key, u64::from(blocks));
        }
    }

    /// A fresh match: the model takes it, unless `key` follows its home `backend` (unpublished).
    fn observe(&mut self, key: u64, backend: usize, blocks: u32, loads: &[BackendLoad]) {
        let prefilling = self
            .homes
            .get(key)
            .is_some_and(|h| h.backend as usize == backend && self.following(&h, loads));
        if !prefilling {
            self.resident.observe(backend, key, u64::from(blocks));
        }
    }

    /// Whether `home` is still followed: prefilling there, or homed within `STICKY` decisions.
    fn following(&self, home: &Home, loads: &[BackendLoad]) -> bool {
        let b = home.backend as usize;
        let prefilling = loads.get(b).is_some_and(|l| l.pending_prefill_blocks > 0);
        let since = u64::from((self.seq as u32).wrapping_sub(home.since));
        prefilling || since <= STICKY * self.pressure.len().max(1) as u64
    }

    /// Takes over `old`'s state (over `old_ids`) by worker id, never by slot or position,
    /// which a membership change shifts; candidates and cached sums start fresh.
    fn carry(&mut self, old: &State, old_ids: &[String], backends: &[PolicyBackend]) {
        let at: HashMap<&str, usize> = old_ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        // New position -> old, and old -> new.
        let from: Vec<Option<usize>> = backends
            .iter()
            .map(|b| at.get(b.id.as_str()).copied())
            .collect();
        let mut to = vec![None; old_ids.len()];
        for (j, f) in from.iter().enumerate() {
            if let Some(i) = f {
                to[*i] = Some(j);
            }
        }
        let (was, n) = (old.pressure.len().max(1), backends.len().max(1));
        // Windows are so many decisions per backend: the same per backend over the new size.
        let per_decision = ((1.0 - old.decay) * was as f64 / n as f64).min(1.0);
        self.pressure = from
            .iter()
            .map(|f| f.and_then(|i| old.pressure.get(i)).copied().unwrap_or(0.0))
            .collect();
        self.unit = old.unit;
        self.seq = old.seq;
        self.homes = old.homes.remap(&to, backends.len(), home_table_keys(n));
        self.decay = 1.0 - per_decision;
        let capacities = backends.iter().map(|b| b.capacity_blocks);
        self.resident = old.resident.remap(&from, capacities);
    }
}

/// The copy rule's fleet summary, reused for a few decisions so a large fleet is not
/// scanned per warm request (docs/kv.md, "Mechanisms").
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

fn step(backend: usize, matched_blocks: u32, kind: DecisionKind, rehome: Rehome) -> Step {
    let decision = Decision {
        backend,
        kind,
        matched_blocks,
    };
    Step { decision, rehome }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod preview_tests;

#[cfg(test)]
mod carry_tests;

#[cfg(test)]
mod remote_tests;
