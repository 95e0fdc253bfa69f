//! `kv_aware` through a membership change: the state a policy built from
//! the new snapshot takes over from the one it replaces.
//!
//! Why: a pool rebuilds its policy whenever a backend is added, removed or
//! drained out. Everything `kv_aware` learned about where prefixes live
//! (homes, popularity and so the expected loads, cache pressure, the
//! modelled caches) is per worker, and
//! the cache index keeps every remaining worker's entries across the
//! change; a policy that started afresh would forget where it put the
//! prefixes still prefilling, charge a stale copy as little as the home,
//! and deal new prefixes out as if every backend were equally loaded. For
//! the remaining workers a change is then the same as the changed worker
//! becoming unusable (the proptests in `kv_carry_tests.rs`).
//!
//! What: positions are mapped by **worker id** (never by index slot or
//! position, which a change shifts). A remaining worker keeps its pressure,
//! its modelled cache and every prefix homed on it;
//! a prefix homed on a removed worker is forgotten, so its next request
//! places it afresh (the index dropped that worker's blocks too), and a
//! copy on a removed worker is dropped from its prefix's holders. A new
//! worker starts empty: no pressure, no homes (the lowest expected load, so
//! cold prefixes go there first).
//! The decision clock (`seq`, `unit`) goes on; windows counted per backend (decays) are
//! rescaled to the new fleet size. Decisions routed with the old policy
//! after the copy (the requests already holding it) are not carried: a few
//! per change at most.

use super::place::State;
use super::tuning::home_table_keys;
use super::PolicyBackend;
use std::collections::HashMap;

impl State {
    /// This state over the snapshot `backends`, from the state of a policy
    /// over `old` worker ids (module docs).
    pub(crate) fn remap(&self, old: &[String], backends: &[PolicyBackend]) -> State {
        let at: HashMap<&str, usize> = old
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        // New position -> old, and old -> new.
        let from: Vec<Option<usize>> = backends
            .iter()
            .map(|b| at.get(b.id.as_str()).copied())
            .collect();
        let mut to = vec![None; old.len()];
        for (j, f) in from.iter().enumerate() {
            if let Some(i) = f {
                to[*i] = Some(j);
            }
        }
        let (was, n) = (self.pressure.len().max(1), backends.len().max(1));
        // Windows are so many decisions per backend: the same memory per
        // backend over the new fleet size.
        let per_decision = ((1.0 - self.decay) * was as f64 / n as f64).min(1.0);
        State {
            pressure: from
                .iter()
                .map(|f| f.and_then(|i| self.pressure.get(i)).copied().unwrap_or(0.0))
                .collect(),
            unit: self.unit,
            seq: self.seq,
            homes: self.homes.remap(&to, backends.len(), home_table_keys(n)),
            decay: 1.0 - per_decision,
            resident: self
                .resident
                .remap(&from, backends.iter().map(|b| b.capacity_blocks)),
            // The admission threshold depends on the fleet's capacity: recomputed.
            tail: std::cell::Cell::new(None),
            // Positions shift: refiled from the next decision's loads.
            cands: self.cands.fresh(backends.len()),
            // Positions shift: the next balance check takes a new summary.
            fleet: std::cell::Cell::new(None),
        }
    }
}
