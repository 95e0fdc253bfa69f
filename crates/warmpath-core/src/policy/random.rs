//! `random`: uniform among eligible backends.

use crate::error::PolicyError;
use crate::route::{
    choose_uniform, decision, Decision, DecisionKind, Loads, Policy, PolicyBackend, PolicyConfig,
    RouteInput,
};
use rand::RngCore;

/// `random`: uniform among eligible backends.
#[derive(Debug, Clone, Copy, Default)]
pub struct Random;

impl Policy for Random {
    fn build(_: &[PolicyBackend], _: &PolicyConfig) -> Result<Self, PolicyError> {
        Ok(Random)
    }

    fn pick(
        &self,
        _: &RouteInput<'_>,
        loads: &Loads<'_>,
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let all = loads.all;
        let backend = choose_uniform(all.len(), rng, |i| all[i].eligible);
        decision(backend, DecisionKind::Random)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::test_util::*;
    use crate::route::BackendLoad;

    #[test]
    fn random_spreads_evenly_and_skips_ineligible() {
        let mut loads = idle(4);
        loads[2].eligible = false;
        let mut counts = [0u32; 4];
        let mut r = rng();
        for _ in 0..3000 {
            let d = Random
                .pick(&RouteInput::default(), &Loads::new(&loads), &mut r)
                .unwrap();
            assert_eq!(d.kind, DecisionKind::Random);
            counts[d.backend] += 1;
        }
        assert_eq!(counts[2], 0);
        for c in [counts[0], counts[1], counts[3]] {
            assert!((800..1200).contains(&c), "{counts:?}");
        }
        let none = vec![BackendLoad::default(); 3];
        assert_eq!(
            Random.pick(&RouteInput::default(), &Loads::new(&none), &mut r),
            Err(PolicyError::NoBackend)
        );
    }
}
