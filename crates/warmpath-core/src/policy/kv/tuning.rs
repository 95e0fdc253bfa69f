//! `kv_aware`'s knobs ([`KvConfig`]) and every named constant of `policy/` but the ring's;
//! docs/kv.md lists them with their measured reasons (a test keeps the two equal).

use crate::error::PolicyError;
use serde::{Deserialize, Deserializer, Serialize};

// `n` is the number of backends: windows scale with it, the same per backend at any size.

/// Decay of pressure and popularity (`200 n`): about one pass over a `long` workload's documents.
pub(crate) const PRESSURE_WINDOW: f64 = 200.0;

/// A copy's holder carries this part of the slack, the rest left to its other homes and noise.
pub(crate) const COPY_SLACK: f64 = 0.75;

/// Before 10 requests of its own per holder a prefix's popularity is noise, not worth a copy.
pub(crate) const COPY_WARMUP: f64 = 10.0;

/// Four times the `long` workload's 16 documents per backend, so the popular ones stay.
pub(crate) const HOMES_PER_BACKEND: usize = 64;

/// A few KiB however small the fleet, at most ~40 MiB (40-byte entries) however large.
pub(crate) const HOME_TABLE_KEYS: (usize, usize) = (1024, 1 << 20);

pub(crate) fn home_table_keys(backends: usize) -> usize {
    (HOMES_PER_BACKEND * backends.max(1)).clamp(HOME_TABLE_KEYS.0, HOME_TABLE_KEYS.1)
}

/// A placement's blocks may be unpublished `4 n` decisions: repeats follow it, not copy it.
pub(crate) const STICKY: u64 = 4;

/// Enough ways that a hot prefix is not evicted by collisions, few enough for one cache line.
pub(crate) const HOME_WAYS: usize = 4;

/// Three inline copies keep an entry at 40 bytes and cover every prefix of up to four shares.
pub(crate) const HOME_INLINE_COPIES: usize = 3;

/// Narrower than the cost band, as evicting a hotter prefix costs a miss on each of its returns.
pub(crate) const FIT_BAND: f64 = 0.125;

/// Above this multiple of the mean load the tail's queued prefills cost more than its churn.
pub(crate) const TAIL_LOAD_MAX: f64 = 1.4;

/// Reusing the fleet summary `n / 64` decisions is exact to 127 backends, and cheap at 1000.
pub(crate) const REUSE_BACKENDS: u64 = 64;

/// `kv_aware`'s knobs (its cost formula: docs/kv.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvConfig {
    /// Fewest matched blocks that count as a useful match (>= 1).
    pub min_match_blocks: u32,
    /// Weight of prefill blocks still to compute (>= 0).
    pub prefill_weight: f64,
    /// Cost of one request in flight, in blocks (>= 0).
    pub decode_weight: f64,
    /// Extra cost of each block the backend must newly cache (>= 0): what
    /// writing a second copy of a prefix costs the fleet's caches.
    pub miss_weight: f64,
    /// A prefix gets deliberate copies once its popularity per holder exceeds the mean expected
    /// load by more than `COPY_SLACK` times this fraction. 0..=10; null turns copies off.
    pub rebalance_slack: Option<f64>,
    /// Removed knobs, refused by name when set ([`REMOVED`]).
    #[serde(skip_serializing)]
    pub(crate) share_slack: Removed<0>,
    #[serde(skip_serializing)]
    pub(crate) pressure_window: Removed<1>,
    #[serde(skip_serializing)]
    pub(crate) placement_tolerance: Removed<2>,
    #[serde(skip_serializing)]
    pub(crate) cold_placement: Removed<3>,
    #[serde(skip_serializing)]
    pub(crate) rebalance_payback: Removed<4>,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            min_match_blocks: 1,
            prefill_weight: 1.0,
            decode_weight: 2.0,
            miss_weight: 1.0,
            rebalance_slack: Some(0.4),
            share_slack: Removed,
            pressure_window: Removed,
            placement_tolerance: Removed,
            cold_placement: Removed,
            rebalance_payback: Removed,
        }
    }
}

impl KvConfig {
    pub(crate) fn validate(&self) -> Result<(), PolicyError> {
        if self.min_match_blocks == 0 {
            return Err(PolicyError::Invalid {
                name: "kv.min_match_blocks",
                reason: "must be at least 1".into(),
            });
        }
        if let Some(s) = self.rebalance_slack.filter(|s| !(0.0..=10.0).contains(s)) {
            return Err(PolicyError::Invalid {
                name: "kv.rebalance_slack",
                reason: format!("{s} must be a number in 0..=10"),
            });
        }
        for (name, v) in [
            ("kv.prefill_weight", self.prefill_weight),
            ("kv.decode_weight", self.decode_weight),
            ("kv.miss_weight", self.miss_weight),
        ] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(PolicyError::Invalid {
                    name,
                    reason: format!("{v} must be a finite number >= 0"),
                });
            }
        }
        Ok(())
    }
}

/// The removed knobs and what to do instead: a `Removed<I>` field refuses `REMOVED[I]`.
const REMOVED: [(&str, &str); 5] = [
    (
        "kv.share_slack",
        "kv_aware copies a prefix only when it is too hot for its holders; \
         tune kv.rebalance_slack (default 0.4; lower copies sooner)",
    ),
    (
        "kv.pressure_window",
        "it is fixed at 200 decisions per backend; delete the line",
    ),
    (
        "kv.placement_tolerance",
        "cold placement's band is fixed at one prefix length; \
         tune balance with kv.rebalance_slack",
    ),
    (
        "kv.cold_placement",
        "a cold prefix is always placed by the cost formula (`ring` lost 3-6 points \
         of hit rate in every capacity cell); replicas share decisions instead \
         (ingest.share_decisions, on by default); delete the line",
    ),
    (
        "kv.rebalance_payback",
        "the payback term was removed (it cost hit rate and TTFT); \
         tune balance with kv.rebalance_slack (null turns copies off)",
    ),
];

/// Removed knob `REMOVED[I]`: refused whatever its value (`null` included).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Removed<const I: usize>;

impl<'de, const I: usize> Deserialize<'de> for Removed<I> {
    fn deserialize<D: Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        let (name, instead) = REMOVED[I];
        Err(serde::de::Error::custom(PolicyError::Removed {
            name,
            instead,
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn knobs_parse_and_are_validated() {
        let cfg: KvConfig = serde_json::from_str(r#"{"miss_weight":0.5}"#).unwrap();
        assert_eq!(cfg.miss_weight, 0.5);
        assert_eq!(cfg.decode_weight, KvConfig::default().decode_weight);
        assert!(cfg.validate().is_ok());
        let err = serde_json::from_str::<KvConfig>(r#"{"cold_placement":"ring"}"#).unwrap_err();
        assert!(err.to_string().contains("share_decisions"), "{err}");
        assert!(serde_json::from_str::<KvConfig>(r#"{"no_such_knob":1}"#).is_err());
        let cfg: KvConfig = serde_json::from_str(r#"{"rebalance_slack":null}"#).unwrap();
        assert_eq!(cfg.rebalance_slack, None);
        for bad in [-0.1, f64::NAN, 11.0] {
            let cfg = KvConfig {
                rebalance_slack: Some(bad),
                ..Default::default()
            };
            assert!(cfg.validate().is_err(), "{bad}");
            let cfg = KvConfig {
                miss_weight: bad.min(-0.1),
                ..Default::default()
            };
            assert!(cfg.validate().is_err(), "{bad}");
        }
        let cfg = KvConfig {
            min_match_blocks: 0,
            ..Default::default()
        };
        assert!(cfg.validate().is_err());
        // What is written reads back the same.
        let d = KvConfig::default();
        let text = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<KvConfig>(&text).unwrap(), d);
    }

    /// The rows of the docs table whose first column header is `header`:
    /// (name, value), both without their backticks.
    fn docs_rows(header: &str) -> Vec<(String, String)> {
        let docs = include_str!("../../../../../docs/kv.md");
        let start = format!("| {header} |");
        let Some(at) = docs.find(&start) else {
            panic!("docs/kv.md has no table headed {header:?}");
        };
        docs[at..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let bare = |c: &str| c.trim_matches('`').to_owned();
                (bare(cells[1]), bare(cells[2]))
            })
            .collect()
    }

    #[test]
    fn the_docs_table_is_the_code() {
        // Every named constant of this file, as its source spells it.
        let consts: Vec<(String, String)> = include_str!("tuning.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("pub(crate) const "))
            .filter_map(|l| {
                let (name, rest) = l.split_once(':')?;
                let value = rest.split_once(" = ")?.1.strip_suffix(';')?;
                Some((name.to_owned(), value.to_owned()))
            })
            .collect();
        assert!(consts.len() >= 10, "{consts:?}");
        assert!(consts.len() <= 12, "issue 39: at most 12 named constants");
        let mut docs = docs_rows("constant");
        let mut code = consts;
        docs.sort();
        code.sort();
        assert_eq!(docs, code, "docs/kv.md's constants table against tuning.rs");
        // The knobs and their defaults, as JSON.
        let defaults = serde_json::to_value(KvConfig::default()).unwrap();
        let fields = defaults.as_object().unwrap();
        let knobs = docs_rows("knob");
        assert_eq!(knobs.len(), fields.len(), "{knobs:?}");
        for (name, value) in &knobs {
            let doc: serde_json::Value = serde_json::from_str(value).unwrap();
            assert_eq!(fields.get(name), Some(&doc), "knob {name}");
        }
    }

    #[test]
    fn a_removed_knob_is_refused_with_its_replacement() {
        for (knob, value, names) in [
            ("share_slack", "0.25", "kv.rebalance_slack"),
            ("share_slack", "null", "kv.rebalance_slack"),
            ("pressure_window", "200", "delete the line"),
            ("placement_tolerance", "1.0", "kv.rebalance_slack"),
            ("rebalance_payback", "2", "kv.rebalance_slack"),
        ] {
            let text = format!(r#"{{"miss_weight":1,"{knob}":{value}}}"#);
            let err = serde_json::from_str::<KvConfig>(&text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("kv.{knob} was removed")), "{err}");
            assert!(err.contains(names), "{err}");
        }
    }
}
