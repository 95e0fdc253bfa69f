//! A pool's `index:` section: the bounds of its cache index, so that no
//! agent can grow the router's memory past what its engines could cache.

use super::error::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// A worker may hold its engine's reported capacity times this (events come in bursts).
pub(super) const CAPACITY_SLACK: f64 = 1.25;

/// How often holders of cleared workers are compacted away.
pub const COMPACT_INTERVAL_MS: u64 = 30_000;

/// Bounds of one pool's cache index.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IndexSettings {
    /// Most (block, worker, tier) entries of the whole pool (>= 1; a worker gets at most a quarter).
    pub max_entries: u64,
}

impl Default for IndexSettings {
    fn default() -> Self {
        IndexSettings {
            // 16M entries: about 0.5-0.9 GB of index.
            max_entries: 1 << 24,
        }
    }
}

impl IndexSettings {
    /// A worker's cap until its capacity is known, and its ceiling: a quarter of `max_entries`.
    pub fn max_worker_blocks(&self) -> u64 {
        (self.max_entries / 4).max(1)
    }

    /// The cap of a worker whose engine reports `capacity` blocks.
    pub fn worker_cap(&self, capacity: Option<u64>) -> u64 {
        let ceiling = self.max_worker_blocks();
        capacity.map_or(ceiling, |c| {
            ((c as f64 * CAPACITY_SLACK).ceil() as u64).clamp(1, ceiling)
        })
    }

    /// Checks the ranges; `at` names the pool (`pools[0]`).
    pub(crate) fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let place = |f: &str| format!("{at}.index.{f}");
        if self.max_entries == 0 {
            return Err(invalid(place("max_entries"), "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;

    #[test]
    fn parses_checks_and_caps() {
        let c = RouterConfig::from_yaml(
            "pools:\n  - model: m\n    index: {max_entries: 4000}\n    backends: [{url: 'http://127.0.0.1:9'}]\n",
        )
        .unwrap();
        let s = c.pools[0].index;
        assert_eq!((s.max_entries, s.max_worker_blocks()), (4000, 1000));
        s.validate("pools[0]").unwrap();
        assert_eq!(s.worker_cap(None), 1000);
        assert_eq!(s.worker_cap(Some(10)), 13, "10 x 1.25, rounded up");
        assert_eq!(s.worker_cap(Some(10_000)), 1000);
        let bad = |f: fn(&mut IndexSettings)| {
            let mut s = IndexSettings::default();
            f(&mut s);
            s.validate("pools[0]").unwrap_err().to_string()
        };
        assert!(bad(|s| s.max_entries = 0).contains("pools[0].index.max_entries"));
        assert!(
            RouterConfig::from_yaml("pools:\n  - model: m\n    index: {max_entry: 1}\n").is_err()
        );
    }
}
