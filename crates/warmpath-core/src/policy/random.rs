//! `random`: uniform among eligible backends.

use super::{
    choose_uniform, BackendLoad, Decision, DecisionKind, Policy, PolicyError, RouteInput, Strategy,
};
use rand::RngCore;

/// Uniform random choice.
#[derive(Debug, Clone, Copy, Default)]
pub struct Random;

impl Policy for Random {
    fn strategy(&self) -> Strategy {
        Strategy::Random
    }

    fn pick(
        &self,
        _input: &RouteInput<'_>,
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        let backend = choose_uniform(loads.len(), rng, |i| loads[i].eligible)
            .ok_or(PolicyError::NoBackend)?;
        Ok(Decision {
            backend,
            kind: DecisionKind::Random,
            matched_blocks: 0,
        })
    }

    /// Holds no state: the pick itself changes nothing but `rng`.
    fn preview(
        &self,
        input: &RouteInput<'_>,
        loads: &[BackendLoad],
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        self.pick(input, loads, rng)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::test_util::*;

    #[test]
    fn spreads_evenly_and_skips_ineligible() {
        let mut loads = idle(4);
        loads[2].eligible = false;
        let mut counts = [0u32; 4];
        let mut r = rng();
        for _ in 0..3000 {
            let d = Random.pick(&RouteInput::default(), &loads, &mut r).unwrap();
            assert_eq!(d.kind, DecisionKind::Random);
            counts[d.backend] += 1;
        }
        assert_eq!(counts[2], 0);
        for c in [counts[0], counts[1], counts[3]] {
            assert!((800..1200).contains(&c), "{counts:?}");
        }
        let none = vec![BackendLoad::default(); 3];
        assert_eq!(
            Random.pick(&RouteInput::default(), &none, &mut r),
            Err(PolicyError::NoBackend)
        );
    }
}
