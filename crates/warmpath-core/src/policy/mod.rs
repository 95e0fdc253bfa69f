//! The routing policies behind one trait ([`Policy`], defined with what it is given
//! and returns in `crate::route`): `random`, `least_outstanding`, `prefix_aware`
//! ([`ring`]) and `kv_aware` ([`kv`], the one with memory: docs/kv.md). This module
//! only declares them and builds a pool's policy.

pub(crate) mod kv;
mod least;
mod random;
mod ring;
#[cfg(test)]
#[path = "util_tests.rs"]
mod test_util;

pub use crate::error::PolicyError;
pub use crate::route::{
    BackendLoad, Built, Decision, DecisionKind, EngineLoad, HomeView, Learns, Loads, Mode, Policy,
    PolicyBackend, PolicyConfig, RemoteDecision, RouteInput, Strategy,
};
pub use kv::tuning::KvConfig;
pub use kv::KvAware;
pub use least::LeastOutstanding;
pub use random::Random;
pub use ring::{PrefixAware, Ring};

use std::sync::Arc;

/// Builds the policy for `strategy` over `snapshot`. With `previous` of the same
/// strategy that learns (a membership change), what it learned of the workers
/// that remain carries over ([`Learns::carried`]); otherwise it starts afresh.
pub fn build_policy(
    strategy: Strategy,
    config: &PolicyConfig,
    snapshot: &[PolicyBackend],
    previous: Option<&Built>,
) -> Result<Built, PolicyError> {
    config.validate()?;
    let carry = previous
        .filter(|p| p.strategy == strategy)
        .and_then(|p| p.learns.as_ref());
    if let Some(learns) = carry {
        return learns.carried(snapshot, config);
    }
    let policy: Arc<dyn Policy> = match strategy {
        Strategy::Random => Arc::new(Random),
        Strategy::LeastOutstanding => Arc::new(LeastOutstanding),
        Strategy::PrefixAware => Arc::new(PrefixAware::build(snapshot, config)?),
        Strategy::KvAware => {
            return Ok(Built::learning(strategy, KvAware::build(snapshot, config)?))
        }
    };
    Ok(Built {
        strategy,
        policy,
        learns: None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use test_util::backends;

    #[test]
    fn only_kv_aware_learns() {
        let cfg = PolicyConfig::default();
        for s in Strategy::ALL {
            let built = build_policy(s, &cfg, &backends(3), None).unwrap();
            assert_eq!(built.learns.is_some(), s == Strategy::KvAware, "{s}");
        }
    }
}
