//! `least_outstanding`: fewest in flight, ties broken at random.

use crate::error::PolicyError;
use crate::route::{
    decision, least_loaded, Decision, DecisionKind, Loads, Policy, PolicyBackend, PolicyConfig,
    RouteInput,
};
use rand::RngCore;

/// `least_outstanding`: fewest in flight, ties broken at random (never by
/// position, which would pile every tie onto the first backend).
#[derive(Debug, Clone, Copy, Default)]
pub struct LeastOutstanding;

impl Policy for LeastOutstanding {
    fn build(_: &[PolicyBackend], _: &PolicyConfig) -> Result<Self, PolicyError> {
        Ok(LeastOutstanding)
    }

    fn pick(
        &self,
        _: &RouteInput<'_>,
        loads: &Loads<'_>,
        rng: &mut dyn RngCore,
    ) -> Result<Decision, PolicyError> {
        decision(least_loaded(loads.all, rng), DecisionKind::LeastOutstanding)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::test_util::*;

    #[test]
    fn least_outstanding_picks_the_least_loaded_and_breaks_ties_randomly() {
        let mut loads = idle(4);
        loads[0].in_flight = 3;
        loads[1].in_flight = 1;
        loads[2].in_flight = 1;
        loads[3].in_flight = 5;
        let mut seen = [0u32; 4];
        let mut r = rng();
        for _ in 0..400 {
            let d = LeastOutstanding
                .pick(&RouteInput::default(), &Loads::new(&loads), &mut r)
                .unwrap();
            seen[d.backend] += 1;
        }
        assert_eq!(seen[0] + seen[3], 0);
        assert!(seen[1] > 120 && seen[2] > 120, "ties split: {seen:?}");
    }
}
