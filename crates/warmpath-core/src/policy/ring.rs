//! `prefix_aware`: consistent hashing with bounded loads (CHWBL, Mirrokni et al.;
//! docs/kv.md). Points are placed by backend **id**, so adding or removing one
//! backend moves only the keys it owns; a key walks clockwise to the first eligible
//! backend below `concurrency_threshold` and `ceil(load_factor * (total + 1) / n)`.

use crate::error::PolicyError;
use crate::route::{
    decision, least_loaded, Decision, DecisionKind, Loads, Policy, PolicyBackend, PolicyConfig,
    RouteInput,
};
use rand::RngCore;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The hash ring: sorted (point, backend position) pairs.
#[derive(Debug, Clone)]
pub struct Ring {
    points: Vec<(u64, u32)>,
    backends: usize,
}

impl Ring {
    /// Places `vnodes` points per backend, by backend id.
    pub fn new(backends: &[PolicyBackend], vnodes: u32) -> Self {
        let mut points = Vec::with_capacity(backends.len() * vnodes as usize);
        for (pos, b) in backends.iter().enumerate() {
            for v in 0..vnodes {
                points.push((xxh3_64_with_seed(b.id.as_bytes(), u64::from(v)), pos as u32));
            }
        }
        points.sort_unstable();
        Ring {
            points,
            backends: backends.len(),
        }
    }

    /// Backend positions in ring order starting at `key`, each once.
    pub fn walk(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let start = self.points.partition_point(|(p, _)| *p < key);
        let mut seen = vec![false; self.backends];
        let n = self.points.len();
        (0..n)
            .map(move |i| self.points[(start + i) % n].1 as usize)
            .filter(move |&b| !std::mem::replace(&mut seen[b], true))
    }

    /// The owner of `key` ignoring load.
    #[cfg(test)]
    pub(crate) fn owner(&self, key: u64) -> Option<usize> {
        self.walk(key).next()
    }
}

/// CHWBL on the prefix key: `prefix_hash` for the first backend of the walk, `spill`
/// for a later one, `least_outstanding` when none has capacity.
#[derive(Debug, Clone)]
pub struct PrefixAware {
    ring: Ring,
    threshold: u32,
    load_factor: f64,
}

impl Policy for PrefixAware {
    fn build(snapshot: &[PolicyBackend], config: &PolicyConfig) -> Result<Self, PolicyError> {
        Ok(PrefixAware {
            ring: Ring::new(snapshot, config.vnodes),
            threshold: config.concurrency_threshold,
            load_factor: config.load_factor,
        })
    }

    fn pick(
        &self,
        request: &RouteInput<'_>,
        loads: &Loads<'_>,
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let loads = loads.all;
        let eligible = loads.iter().filter(|l| l.eligible).count();
        if eligible == 0 {
            return Err(PolicyError::NoBackend);
        }
        let total: u64 = loads
            .iter()
            .filter(|l| l.eligible)
            .map(|l| u64::from(l.effective_in_flight()))
            .sum();
        let bound = (self.load_factor * (total + 1) as f64 / eligible as f64).ceil() as u64;
        let mut kind = DecisionKind::PrefixHash;
        for pos in self.ring.walk(request.prefix_key) {
            let Some(l) = loads.get(pos) else { continue };
            if !l.eligible {
                continue;
            }
            let inflight = l.effective_in_flight();
            if inflight < self.threshold && u64::from(inflight) < bound {
                return decision(Some(pos), kind);
            }
            kind = DecisionKind::Spill;
        }
        decision(least_loaded(loads, rng), DecisionKind::LeastOutstanding)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::test_util::*;
    use proptest::prelude::*;

    fn pa(n: usize, threshold: u32) -> PrefixAware {
        let cfg = PolicyConfig {
            concurrency_threshold: threshold,
            ..Default::default()
        };
        PrefixAware::build(&backends(n), &cfg).unwrap()
    }

    fn input(key: u64) -> RouteInput<'static> {
        RouteInput {
            prefix_key: key,
            ..Default::default()
        }
    }

    #[test]
    fn same_key_same_backend() {
        let p = pa(5, 8);
        let loads = idle(5);
        let mut r = rng();
        let a = p.pick(&input(42), &Loads::new(&loads), &mut r).unwrap();
        for _ in 0..10 {
            assert_eq!(p.pick(&input(42), &Loads::new(&loads), &mut r).unwrap(), a);
        }
        assert_eq!(a.kind, DecisionKind::PrefixHash);
    }

    #[test]
    fn spills_at_the_threshold_then_least_outstanding() {
        let p = pa(3, 2);
        let mut loads = idle(3);
        let mut r = rng();
        let owner = p
            .pick(&input(7), &Loads::new(&loads), &mut r)
            .unwrap()
            .backend;
        loads[owner].in_flight = 2;
        let d = p.pick(&input(7), &Loads::new(&loads), &mut r).unwrap();
        assert_eq!(d.kind, DecisionKind::Spill);
        assert_ne!(d.backend, owner);
        for l in &mut loads {
            l.in_flight = 2;
        }
        loads[(owner + 1) % 3].in_flight = 5;
        let d = p.pick(&input(7), &Loads::new(&loads), &mut r).unwrap();
        assert_eq!(d.kind, DecisionKind::LeastOutstanding);
        assert_ne!(d.backend, (owner + 1) % 3);
    }

    #[test]
    fn bounded_load_caps_a_hot_key() {
        // One hot key, requests never finish: no backend may exceed
        // ceil(1.25 * (total+1) / n).
        let p = pa(4, 1024);
        let mut loads = idle(4);
        let mut r = rng();
        for _ in 0..400 {
            let d = p.pick(&input(99), &Loads::new(&loads), &mut r).unwrap();
            loads[d.backend].in_flight += 1;
        }
        let max = loads.iter().map(|l| l.in_flight).max().unwrap();
        assert!(
            max <= (1.25f64 * 400.0 / 4.0).ceil() as u32 + 1,
            "{loads:?}"
        );
    }

    #[test]
    fn spreads_many_keys() {
        let p = pa(8, 1024);
        let loads = idle(8);
        let mut counts = [0u32; 8];
        let mut r = rng();
        for k in 0..16_000u64 {
            let key = xxh3_64_with_seed(&k.to_le_bytes(), 0);
            counts[p
                .pick(&input(key), &Loads::new(&loads), &mut r)
                .unwrap()
                .backend] += 1;
        }
        for c in counts {
            assert!((1500..2500).contains(&c), "{counts:?}");
        }
    }

    proptest! {
        /// Adding one backend to N moves about 1/(N+1) of keys, all of them to
        /// the new backend; removing it moves them back.
        #[test]
        fn adding_a_backend_moves_only_its_share(n in 2usize..12, extra in 0u32..1000) {
            let before = backends(n);
            let mut after = before.clone();
            after.push(PolicyBackend { id: format!("new{extra}"), slot: 99, capacity_blocks: None });
            let r1 = Ring::new(&before, 160);
            let r2 = Ring::new(&after, 160);
            let keys = 4000u64;
            let mut moved = 0;
            for k in 0..keys {
                let key = xxh3_64_with_seed(&k.to_le_bytes(), 1);
                let (a, b) = (r1.owner(key).unwrap(), r2.owner(key).unwrap());
                if a != b {
                    prop_assert_eq!(b, n, "a moved key goes to the new backend");
                    moved += 1;
                }
            }
            let share = moved as f64 / keys as f64;
            let ideal = 1.0 / (n + 1) as f64;
            prop_assert!((share - ideal).abs() < ideal * 0.5 + 0.02, "moved {share}, ideal {ideal}");
        }
    }
}
