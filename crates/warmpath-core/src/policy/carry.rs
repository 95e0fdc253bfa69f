//! `kv_aware` through a membership change: the new policy takes over the old
//! one's state by worker id, never by slot or position, which a change shifts
//! (docs/kv.md, "Carry-over").

use super::candidates::Candidates;
use super::place::State;
use super::tuning::home_table_keys;
use super::PolicyBackend;
use std::collections::HashMap;

impl State {
    /// This state, of a policy over `old` worker ids, over the snapshot `backends` (whose
    /// candidates, `cands`, are filed from the next decision's loads).
    pub(crate) fn remap(
        &self,
        old: &[String],
        backends: &[PolicyBackend],
        cands: Candidates,
    ) -> State {
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
        // Windows are so many decisions per backend: the same per backend over the new size.
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
            cands,
            // Positions shift: the next balance check takes a new summary.
            fleet: std::cell::Cell::new(None),
            preview: None,
        }
    }
}
