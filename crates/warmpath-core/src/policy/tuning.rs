//! `kv_aware`'s tuning: its six knobs ([`KvConfig`]) and every named
//! constant of `policy/` but the ring's, in one place, each with why it has
//! its value; docs/kv.md lists them and a test keeps that list equal to
//! this file.
//!
//! Knobs that were removed are still recognised by name, so a config that
//! sets one is refused at start-up with its replacement
//! ([`PolicyError::Removed`]) instead of being ignored.

use super::PolicyError;
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize};

// The constants (docs/kv.md has each with its measured reason). `n` is the
// number of backends: windows scale with it, so each backend waits the same
// number of its own requests however large the fleet.

/// Decisions per backend of decay for pressure and popularity (`200 n`):
/// about one pass over a `long` workload's 16 documents per backend, enough
/// to rank backends by what they wrote, short enough to forget a document
/// that stopped coming. (Formerly `kv.pressure_window`.)
pub(crate) const PRESSURE_WINDOW: f64 = 200.0;

/// The part of `rebalance_slack` a copy's holder may carry above the mean
/// from the copied prefix alone: the rest is left to its other homes and
/// the noise of its share.
pub(crate) const COPY_SLACK: f64 = 0.75;

/// Requests of its own per holder a prefix must have brought before one
/// more copy: before that its popularity is noise.
pub(crate) const COPY_WARMUP: f64 = 10.0;

/// Prefixes the home table remembers per backend: four times the `long`
/// workload's 16 documents per backend, so the popular ones stay.
pub(crate) const HOMES_PER_BACKEND: usize = 64;

/// The home table's bounds, in prefixes: a few KiB however small the
/// fleet, at most ~40 MiB (40-byte entries) however large, so memory stays
/// bounded while `HOMES_PER_BACKEND` holds up to 16k backends.
pub(crate) const HOME_TABLE_KEYS: (usize, usize) = (1024, 1 << 20);

/// The home table's room for a fleet of `backends`.
pub(crate) fn home_table_keys(backends: usize) -> usize {
    (HOMES_PER_BACKEND * backends.max(1)).clamp(HOME_TABLE_KEYS.0, HOME_TABLE_KEYS.1)
}

/// Decisions per backend a placement stays followed after it was made
/// (`4 n`), with no prefill queued there: its blocks may not be published
/// yet, and a repeat must not start a second cold copy elsewhere.
pub(crate) const STICKY: u64 = 4;

/// Ways of the home table's sets: enough that a hot prefix is not evicted
/// by hash collisions, few enough that a lookup is one cache line.
pub(crate) const HOME_WAYS: usize = 4;

/// Copies kept in a home table entry: three keep it at 40 bytes and cover
/// every prefix of up to four even shares; the rest spill.
pub(crate) const HOME_INLINE_COPIES: usize = 3;

/// Cold placement's eviction band, in the prefix's blocks: narrower than
/// the cost band of one prefix, since evicting a hotter prefix costs a miss
/// on each of its returns, not one prefill.
pub(crate) const FIT_BAND: f64 = 0.125;

/// A tail prefix concentrates only on backends at most this multiple of the
/// mean expected load (the default slack's bound): beyond it the tail's
/// queued cold prefills cost more TTFT than its churn costs elsewhere.
pub(crate) const TAIL_LOAD_MAX: f64 = 1.4;

/// A fleet summary (`rebalance::Fleet`) is reused for `n / 64` decisions: exact up to
/// 127 backends; at 1000 it saves a pass per warm request while the mean
/// moves by about `1 / (PRESSURE_WINDOW x 64)` of itself.
pub(crate) const REUSE_BACKENDS: u64 = 64;

/// `kv_aware`'s knobs (its cost formula: docs/kv.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "KvConfigFile")]
pub struct KvConfig {
    /// Fewest matched blocks that count as a useful match (>= 1).
    pub min_match_blocks: u32,
    /// Weight of prefill blocks still to compute (>= 0).
    pub prefill_weight: f64,
    /// Cost of one request in flight, in blocks (>= 0).
    pub decode_weight: f64,
    /// Extra cost of each block the backend must newly cache (>= 0): what
    /// writing a second copy of a prefix costs the fleet's caches. At 0 a
    /// request leaves a holder that has one cold prefill queued for an idle
    /// backend whose full prefill takes as long; at 1 it stays unless the
    /// holder's queue is about twice the request's own prefill.
    pub miss_weight: f64,
    /// A prefix gets deliberate copies once its
    /// popularity per holder exceeds the mean expected load by more than
    /// `COPY_SLACK` times this fraction. 0..=10; `None` (null) turns
    /// copies off. Default 0.4.
    pub rebalance_slack: Option<f64>,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            min_match_blocks: 1,
            prefill_weight: 1.0,
            decode_weight: 2.0,
            miss_weight: 1.0,
            rebalance_slack: Some(0.4),
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
        if let Some(s) = self.rebalance_slack {
            if !(0.0..=10.0).contains(&s) {
                return Err(PolicyError::Invalid {
                    name: "kv.rebalance_slack",
                    reason: format!("{s} must be a number in 0..=10"),
                });
            }
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

/// The knobs as a config file spells them, removed ones included.
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct KvConfigFile {
    min_match_blocks: u32,
    prefill_weight: f64,
    decode_weight: f64,
    miss_weight: f64,
    #[serde(deserialize_with = "present")]
    cold_placement: bool,
    rebalance_slack: Option<f64>,
    #[serde(deserialize_with = "present")]
    share_slack: bool,
    #[serde(deserialize_with = "present")]
    pressure_window: bool,
    #[serde(deserialize_with = "present")]
    placement_tolerance: bool,
    #[serde(deserialize_with = "present")]
    rebalance_payback: bool,
}

impl Default for KvConfigFile {
    fn default() -> Self {
        let d = KvConfig::default();
        KvConfigFile {
            min_match_blocks: d.min_match_blocks,
            prefill_weight: d.prefill_weight,
            decode_weight: d.decode_weight,
            miss_weight: d.miss_weight,
            cold_placement: false,
            rebalance_slack: d.rebalance_slack,
            share_slack: false,
            pressure_window: false,
            placement_tolerance: false,
            rebalance_payback: false,
        }
    }
}

/// True whenever the key is there, whatever its value (`null` included).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(d).map(|_| true)
}

impl TryFrom<KvConfigFile> for KvConfig {
    type Error = PolicyError;

    fn try_from(f: KvConfigFile) -> Result<Self, PolicyError> {
        let removed = [
            (
                f.share_slack,
                "kv.share_slack",
                "kv_aware copies a prefix only when it is too hot for its holders; \
                 tune kv.rebalance_slack (default 0.4; lower copies sooner)",
            ),
            (
                f.pressure_window,
                "kv.pressure_window",
                "it is fixed at 200 decisions per backend; delete the line",
            ),
            (
                f.placement_tolerance,
                "kv.placement_tolerance",
                "cold placement's band is fixed at one prefix length; \
                 tune balance with kv.rebalance_slack",
            ),
            (
                f.cold_placement,
                "kv.cold_placement",
                "a cold prefix is always placed by the cost formula (`ring` lost 3-6 points \
                 of hit rate in every capacity cell); replicas share decisions instead \
                 (ingest.share_decisions, on by default); delete the line",
            ),
            (
                f.rebalance_payback,
                "kv.rebalance_payback",
                "the payback term was removed (it cost hit rate and TTFT); \
                 tune balance with kv.rebalance_slack (null turns copies off)",
            ),
        ];
        if let Some(&(_, name, instead)) = removed.iter().find(|r| r.0) {
            return Err(PolicyError::Removed { name, instead });
        }
        Ok(KvConfig {
            min_match_blocks: f.min_match_blocks,
            prefill_weight: f.prefill_weight,
            decode_weight: f.decode_weight,
            miss_weight: f.miss_weight,
            rebalance_slack: f.rebalance_slack,
        })
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
        let docs = include_str!("../../../../docs/kv.md");
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
