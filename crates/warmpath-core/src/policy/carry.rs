//! `kv_aware` through a membership change: state is carried by worker id, never by slot or
//! position, which a change shifts (docs/kv.md, "Carry-over").

use super::place::State;
use super::tuning::home_table_keys;
use crate::route::PolicyBackend;
use std::collections::HashMap;

impl State {
    /// Takes over `old`'s state (over `old_ids`); candidates and cached summaries stay fresh.
    pub(crate) fn carry(&mut self, old: &State, old_ids: &[String], backends: &[PolicyBackend]) {
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
