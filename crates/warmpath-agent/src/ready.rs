//! Readiness: what `/livez` and `/readyz` (and `/health`) answer, and the
//! gauges that say the same (the rules: docs/agent.md, "Agent").

use crate::stats::Stats;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Prompt-token growth that counts as traffic: a few probe completions
/// (a handful of tokens each, no full KV block, so no event) do not.
pub const MIN_PROMPT_TOKENS: u64 = 256;

/// `prompt_tokens` before the engine's page showed the counter.
const UNKNOWN: u64 = u64::MAX;

/// What readiness is made of, written by the load scraper, the router
/// links (through [`Stats::router_streams`]) and [`watch`].
#[derive(Debug)]
pub struct Readiness {
    /// Engine reachability is checked (load scraping is on).
    engine_checked: bool,
    /// The latest scrape answered.
    engine_up: AtomicBool,
    prompt_tokens: AtomicU64,
    events_silent: AtomicBool,
}

impl Readiness {
    /// Nothing known yet: not ready until the engine and a router answered.
    pub fn new(engine_checked: bool) -> Self {
        Readiness {
            engine_checked,
            engine_up: AtomicBool::new(false),
            prompt_tokens: AtomicU64::new(UNKNOWN),
            events_silent: AtomicBool::new(false),
        }
    }

    /// A scrape of the engine's metrics page: whether it answered, and its
    /// `vllm:prompt_tokens_total` when the page has it.
    pub fn engine_scraped(&self, up: bool, prompt_tokens: Option<u64>) {
        self.engine_up.store(up, Ordering::Relaxed);
        if let Some(t) = prompt_tokens {
            self.prompt_tokens
                .store(t.min(UNKNOWN - 1), Ordering::Relaxed);
        }
    }

    fn prompt_tokens(&self) -> Option<u64> {
        Some(self.prompt_tokens.load(Ordering::Relaxed)).filter(|t| *t != UNKNOWN)
    }

    /// Why the agent is not ready now (`engine_unreachable`,
    /// `no_router_stream`, `kv_events_silent`); empty when it is.
    pub fn not_ready(&self, stats: &Stats) -> Vec<&'static str> {
        let mut not_ready = Vec::new();
        if self.engine_checked && !self.engine_up.load(Ordering::Relaxed) {
            not_ready.push("engine_unreachable");
        }
        if stats.router_streams.get() == 0 {
            not_ready.push("no_router_stream");
        }
        if self.events_silent.load(Ordering::Relaxed) {
            not_ready.push("kv_events_silent");
        }
        not_ready
    }
}

/// Follows event arrivals against prompt-token growth every `every` and
/// keeps the gauges current, until `cancel`. `endpoint` is the configured
/// event endpoint (named in the error).
pub async fn watch(
    ready: Arc<Readiness>,
    stats: Arc<Stats>,
    every: Duration,
    silence: Duration,
    endpoint: String,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut silence_check = SilenceCheck {
        silence,
        ..Default::default()
    };
    let mut logged = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let silent =
            silence_check.observe(Instant::now(), stats.batches.get(), ready.prompt_tokens());
        if silent && !logged {
            logged = true;
            tracing::error!(
                endpoint = %endpoint,
                "no KV event arrived for {} ms while the engine served prompt tokens; \
                 the agent follows {endpoint}. vLLM connects instead of binding when the \
                 endpoint is not a wildcard (tcp://*:PORT); point it at tcp://*:PORT \
                 (the agent keeps --kv-events tcp://HOST:PORT)",
                silence.as_millis()
            );
        }
        ready.events_silent.store(silent, Ordering::Relaxed);
        let ok = ready.not_ready(&stats).is_empty();
        let flag = |b: bool| f64::from(u8::from(b));
        metrics::gauge!("warmpath_agent_ready").set(flag(ok));
        metrics::gauge!("warmpath_agent_engine_up")
            .set(flag(ready.engine_up.load(Ordering::Relaxed)));
        metrics::gauge!("warmpath_agent_router_streams").set(stats.router_streams.get() as f64);
        metrics::gauge!("warmpath_agent_kv_events_silent").set(flag(silent));
    }
}

/// "Prompt tokens grew, then no event batch for `silence`".
#[derive(Debug, Default)]
struct SilenceCheck {
    silence: Duration,
    batches: u64,
    /// Prompt tokens when the last batch arrived (or first seen).
    baseline: Option<u64>,
    /// When growth past the baseline was first seen.
    grew_at: Option<Instant>,
}

impl SilenceCheck {
    /// One observation; returns whether the events are silent.
    fn observe(&mut self, now: Instant, batches: u64, tokens: Option<u64>) -> bool {
        if batches != self.batches {
            self.batches = batches;
            self.baseline = tokens;
            self.grew_at = None;
            return false;
        }
        let Some(t) = tokens else { return false };
        match self.baseline {
            // A restarted engine counts from 0 again.
            Some(b) if t >= b => {
                if t - b >= MIN_PROMPT_TOKENS && self.grew_at.is_none() {
                    self.grew_at = Some(now);
                }
            }
            _ => {
                self.baseline = Some(t);
                self.grew_at = None;
            }
        }
        self.grew_at
            .is_some_and(|g| now.duration_since(g) >= self.silence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_only_after_growth_then_silence_and_an_event_clears_it() {
        let s = Duration::from_millis(100);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut c = SilenceCheck {
            silence: s,
            ..Default::default()
        };
        assert!(!c.observe(at(0), 0, Some(1000)), "baseline");
        assert!(!c.observe(at(500), 0, Some(1000)), "no growth, no alarm");
        assert!(!c.observe(at(600), 0, Some(1000 + MIN_PROMPT_TOKENS - 1)));
        assert!(
            !c.observe(at(700), 0, Some(1000 + MIN_PROMPT_TOKENS)),
            "grew"
        );
        assert!(!c.observe(at(750), 0, Some(5000)));
        assert!(c.observe(at(800), 0, Some(5000)), "silent for 100 ms");
        assert!(!c.observe(at(810), 1, Some(5000)), "an event arrived");
        assert!(!c.observe(at(2000), 1, Some(5000)));
        assert!(
            !c.observe(at(2100), 1, Some(10)),
            "engine restart: new baseline"
        );
        assert!(!c.observe(at(2200), 1, None), "no counter: nothing to say");
    }
}
