//! Where the scale run's uncached tokens come from, and what its slowest
//! 10% of requests are (fleets of at most 64 instances; the classes are in
//! docs/bench.md, "The `scale` model").

use serde::Serialize;
use std::collections::BTreeMap;

/// What the router could know of a request's document when it routed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Origin {
    FirstSight,
    InPrefill,
    CachedElsewhere,
    HeldHere,
    EvictedHere,
    EvictedElsewhere,
}

impl Origin {
    /// The class of a miss with this origin.
    fn miss_class(self) -> &'static str {
        match self {
            Origin::FirstSight => "first_sight",
            Origin::InPrefill => "in_prefill",
            Origin::CachedElsewhere => "cached_elsewhere",
            Origin::HeldHere | Origin::EvictedHere => "evicted_here",
            Origin::EvictedElsewhere => "evicted_elsewhere",
        }
    }
}

/// Per-document state the classification needs.
#[derive(Clone, Debug, Default)]
pub(crate) struct DocState {
    pub(crate) routed: u64,
    /// Requests routed whose prefill has not finished.
    pub(crate) pending: u32,
    /// Instances that have ever cached it (bit per instance).
    pub(crate) ever: u64,
}

impl DocState {
    /// The origin of a request routed to `chosen` when `holders` hold it now.
    pub(crate) fn origin(&self, chosen: usize, holders: u64) -> Origin {
        let me = 1u64 << chosen;
        if self.routed == 0 {
            Origin::FirstSight
        } else if holders & me != 0 {
            Origin::HeldHere
        } else if holders != 0 {
            Origin::CachedElsewhere
        } else if self.ever & me != 0 {
            Origin::EvictedHere
        } else if self.ever != 0 {
            Origin::EvictedElsewhere
        } else if self.pending > 0 {
            Origin::InPrefill
        } else {
            // Cannot happen: every prefill caches its document.
            Origin::EvictedElsewhere
        }
    }
}

/// One finished request, as the breakdown sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) origin: Origin,
    pub(crate) hit: bool,
    pub(crate) uncached_tokens: u64,
    /// What a full document hit leaves uncached (the question).
    pub(crate) tail_tokens: u64,
    pub(crate) ttft_ms: f64,
    /// Time queued before its own prefill started.
    pub(crate) wait_ms: f64,
    /// It queued behind a cold prefill on its instance.
    pub(crate) behind_cold: bool,
}

/// The breakdown of a run (see the module docs).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Diagnosis {
    pub prompt_tokens: u64,
    /// Uncached tokens by class.
    pub uncached_tokens: BTreeMap<String, u64>,
    /// Requests that missed their document, by class.
    pub missed_requests: BTreeMap<String, u64>,
    /// The slowest 10% of requests by TTFT, by class (`warm`,
    /// `warm_behind_cold`: a hit queued behind a cold prefill).
    pub top10_ttft: BTreeMap<String, u64>,
    /// The TTFT that starts the slowest 10% (the P90), ms.
    pub top10_from_ms: f64,
    /// Mean queueing before prefill of the warm requests in the slowest 10%, ms.
    pub top10_warm_wait_ms: f64,
}

impl Diagnosis {
    pub(crate) fn of(samples: &[Sample], prompt_tokens: u64) -> Self {
        let mut d = Diagnosis {
            prompt_tokens,
            ..Default::default()
        };
        for s in samples {
            if s.hit {
                let question = s.uncached_tokens.min(s.tail_tokens);
                *d.uncached_tokens.entry("question".into()).or_default() += question;
                let trimmed = s.uncached_tokens - question;
                if trimmed > 0 {
                    *d.uncached_tokens.entry("trimmed".into()).or_default() += trimmed;
                }
            } else {
                let class = s.origin.miss_class();
                *d.missed_requests.entry(class.to_owned()).or_default() += 1;
                *d.uncached_tokens.entry(class.to_owned()).or_default() += s.uncached_tokens;
            }
        }
        let mut by_ttft: Vec<&Sample> = samples.iter().collect();
        by_ttft.sort_by(|a, b| b.ttft_ms.total_cmp(&a.ttft_ms));
        let top = by_ttft.len().div_ceil(10);
        let (mut warm_wait, mut warm) = (0.0, 0u32);
        for s in &by_ttft[..top] {
            let class = match (s.hit, s.behind_cold) {
                (true, false) => "warm",
                (true, true) => "warm_behind_cold",
                (false, _) => s.origin.miss_class(),
            };
            if s.hit {
                warm_wait += s.wait_ms;
                warm += 1;
            }
            *d.top10_ttft.entry(class.to_owned()).or_default() += 1;
        }
        d.top10_from_ms = by_ttft
            .get(top.saturating_sub(1))
            .map_or(0.0, |s| s.ttft_ms);
        d.top10_warm_wait_ms = crate::stats::ratio(warm_wait, f64::from(warm));
        d
    }

    pub fn lines(&self) -> Vec<String> {
        let list = |m: &BTreeMap<String, u64>, f: &dyn Fn(u64) -> String| {
            let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k} {}", f(*v))).collect();
            parts.join(", ")
        };
        let pct = |v: u64| {
            format!(
                "{:.2}%",
                100.0 * v as f64 / self.prompt_tokens.max(1) as f64
            )
        };
        let (from, wait) = (self.top10_from_ms, self.top10_warm_wait_ms);
        vec![
            format!(
                "uncached tokens (% of prompt): {}",
                list(&self.uncached_tokens, &pct)
            ),
            format!(
                "missed requests: {}",
                list(&self.missed_requests, &|v| v.to_string())
            ),
            format!(
                "slowest 10% (TTFT >= {from:.0} ms): {}; warm ones queued {wait:.0} ms on average",
                list(&self.top10_ttft, &|v| v.to_string())
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_follow_what_the_router_could_know() {
        let mut d = DocState::default();
        assert_eq!(d.origin(0, 0), Origin::FirstSight);
        d.routed = 1;
        d.pending = 1;
        assert_eq!(d.origin(0, 0), Origin::InPrefill);
        d.ever = 0b10;
        assert_eq!(d.origin(0, 0b10), Origin::CachedElsewhere);
        assert_eq!(d.origin(1, 0b10), Origin::HeldHere);
        assert_eq!(d.origin(1, 0), Origin::EvictedHere);
        assert_eq!(d.origin(0, 0), Origin::EvictedElsewhere);
    }

    #[test]
    fn breakdown_counts_tokens_and_the_slowest_tenth() {
        let s = |origin, hit, tokens, ttft, behind_cold| Sample {
            origin,
            hit,
            uncached_tokens: tokens,
            tail_tokens: 50,
            ttft_ms: ttft,
            wait_ms: 5.0,
            behind_cold,
        };
        let mut samples = vec![s(Origin::HeldHere, true, 50, 15.0, false); 17];
        samples.push(s(Origin::HeldHere, true, 850, 35.0, false));
        samples.push(s(Origin::FirstSight, false, 8000, 200.0, false));
        samples.push(s(Origin::HeldHere, true, 50, 180.0, true));
        let d = Diagnosis::of(&samples, 20 * 8050);
        assert_eq!(d.uncached_tokens["first_sight"], 8000);
        assert_eq!(d.uncached_tokens["question"], 19 * 50);
        assert_eq!(d.uncached_tokens["trimmed"], 800);
        assert_eq!(d.missed_requests["first_sight"], 1);
        assert_eq!(d.top10_ttft["first_sight"], 1);
        assert_eq!(d.top10_ttft["warm_behind_cold"], 1);
        assert_eq!(d.top10_from_ms, 180.0);
        assert_eq!(d.lines().len(), 3);
    }
}
