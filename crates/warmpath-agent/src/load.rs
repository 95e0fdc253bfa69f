//! Load scraping of the engine's Prometheus `/metrics`, summed over label sets
//! (several engines or DP ranks behind one endpoint); also feeds readiness and
//! restart detection.

use crate::ready::Readiness;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use warmpath_proto::v1::Load;

/// Parses Prometheus text exposition into a [`Load`] (with `engine_up` true).
/// Returns `None` when none of the three metrics is present.
pub fn parse_metrics(text: &str) -> Option<Load> {
    let running = sum_of(text, "vllm:num_requests_running");
    let waiting = sum_of(text, "vllm:num_requests_waiting");
    // A 0..1 fraction despite its name (older releases: gpu_...), averaged.
    let usage: Vec<f64> = ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
        .into_iter()
        .flat_map(|name| samples(text, name).filter_map(|(_, v)| v))
        .collect();
    if running.is_none() && waiting.is_none() && usage.is_empty() {
        return None;
    }
    let capacity = samples(text, "vllm:cache_config_info").fold(0u64, |c, (labels, _)| {
        c.saturating_add(label_u64(labels, "num_gpu_blocks"))
    });
    let count = |v: Option<f64>| v.unwrap_or(0.0).max(0.0).min(u32::MAX as f64) as u32;
    Some(Load {
        running: count(running),
        waiting: count(waiting),
        kv_usage: (usage.iter().sum::<f64>() / usage.len().max(1) as f64).clamp(0.0, 1.0) as f32,
        engine_up: true,
        capacity_blocks: capacity,
        partial: false,
    })
}

/// The slack before a view is partial: this fraction of the capacity, plus
/// one block per running request (vLLM counts a request's partly filled last
/// block as used but publishes only full ones; usage is sampled mid-stream).
const PARTIAL_SLACK_DIV: u64 = 20;

/// Whether `known` blocks cannot cover the engine's current KV usage in
/// `load`: the engine holds blocks the agent never saw. Unknown capacity or a
/// down engine: `false`, as nothing says the view misses anything.
pub fn view_is_partial(load: &Load, known: u64) -> bool {
    if load.capacity_blocks == 0 || !load.engine_up {
        return false;
    }
    let used = (f64::from(load.kv_usage) * load.capacity_blocks as f64) as u64;
    let slack = u64::from(load.running) + load.capacity_blocks / PARTIAL_SLACK_DIV;
    used > known.saturating_add(slack)
}

/// The value of label `name` in `{a="1",name="42",...}` as a number (0 when
/// absent or not a number).
fn label_u64(labels: &str, name: &str) -> u64 {
    let Some(inner) = labels.strip_prefix('{').and_then(|l| l.split('}').next()) else {
        return 0;
    };
    inner
        .split(',')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.trim_matches('"').parse().ok())
        .unwrap_or(0)
}

/// Each sample of series `name` in a Prometheus text page: its labels (`{...}`,
/// or empty) and its value, when a finite number (a timestamp may follow it).
pub fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, Option<f64>)> {
    text.lines().filter_map(move |line| {
        let rest = line.trim().strip_prefix(name)?;
        let (labels, rest) = match rest.strip_prefix('{') {
            Some(inner) => {
                let end = inner.rfind('}')? + 2;
                (&rest[..end], &rest[end..])
            }
            None if rest.starts_with(' ') => ("", rest),
            None => return None, // a longer name with this prefix
        };
        let value = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite());
        Some((labels, value))
    })
}

/// The sum over label sets of counter or gauge `name`, if the page has it.
pub fn sum_of(text: &str, name: &str) -> Option<f64> {
    samples(text, name)
        .filter_map(|(_, v)| v)
        .fold(None, |sum, v| Some(sum.unwrap_or(0.0) + v))
}

/// Tells an engine restart from a run of scrapes: its
/// `process_start_time_seconds` changed, or, on a page without one, it came
/// back after at least [`RestartWatch::DOWN_SCRAPES`] failed scrapes in a row
/// (one failed scrape is a blip, not a restart).
#[derive(Debug, Default)]
pub struct RestartWatch {
    start_time: Option<f64>,
    down: u32,
    was_up: bool,
}

impl RestartWatch {
    /// Failed scrapes in a row that, followed by an answer, count as a restart
    /// when the page has no start time.
    pub const DOWN_SCRAPES: u32 = 2;

    /// One scrape: `None` failed, `Some(start)` answered with its start time
    /// if the page has one. True when the engine restarted since the last.
    pub fn observe(&mut self, scrape: Option<Option<f64>>) -> bool {
        let Some(start) = scrape else {
            self.down += 1;
            return false;
        };
        let restarted = match (start, self.start_time) {
            (Some(new), Some(old)) => (new - old).abs() > 0.5,
            (None, _) => self.was_up && self.down >= Self::DOWN_SCRAPES,
            (Some(_), None) => false,
        };
        if start.is_some() {
            self.start_time = start;
        }
        self.down = 0;
        self.was_up = true;
        restarted
    }
}

/// Scrapes `{engine_url}/metrics` every `every` and publishes into `tx`; a
/// failed scrape publishes the last good values with `engine_up` false. An
/// engine restart bumps `restarts`.
pub async fn scrape_loop(
    engine_url: String,
    every: Duration,
    tx: watch::Sender<Option<Load>>,
    restarts: watch::Sender<u64>,
    ready: Arc<Readiness>,
    cancel: CancellationToken,
) {
    let mut restart = RestartWatch::default();
    let url = format!("{}/metrics", engine_url.trim_end_matches('/'));
    let client = match reqwest::Client::builder()
        .timeout(every.max(Duration::from_millis(500)))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the HTTP client; load scraping off");
            return;
        }
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Load::default();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let got = async {
            let resp = client.get(&url).send().await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("HTTP {}", resp.status()));
            }
            let text = resp.text().await.map_err(|e| e.to_string())?;
            let load = parse_metrics(&text)
                .ok_or_else(|| "no vllm load metrics in the page".to_owned())?;
            let prompt = sum_of(&text, "vllm:prompt_tokens_total").map(|v| v.max(0.0) as u64);
            Ok((load, prompt, sum_of(&text, "process_start_time_seconds")))
        };
        let got = tokio::select! {
            _ = cancel.cancelled() => return,
            g = got => g,
        };
        let scrape = got.as_ref().ok().map(|(_, _, start)| *start);
        if restart.observe(scrape) {
            tracing::warn!(%url, "the engine restarted: forgetting its blocks");
            restarts.send_modify(|n| *n += 1);
        }
        let load = match got {
            Ok((l, prompt, _)) => {
                ready.engine_scraped(true, prompt);
                last = l;
                l
            }
            Err(why) => {
                ready.engine_scraped(false, None);
                metrics::counter!("warmpath_agent_load_scrape_errors_total").increment(1);
                tracing::debug!(%url, %why, "load scrape failed");
                Load {
                    engine_up: false,
                    ..last
                }
            }
        };
        metrics::gauge!("warmpath_agent_engine_running").set(f64::from(load.running));
        metrics::gauge!("warmpath_agent_engine_waiting").set(f64::from(load.waiting));
        metrics::gauge!("warmpath_agent_engine_kv_usage").set(f64::from(load.kv_usage));
        if tx.send(Some(load)).is_err() {
            return; // nobody listens any more
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_is_a_new_start_time_or_a_return_after_an_outage() {
        let mut w = RestartWatch::default();
        assert!(!w.observe(Some(Some(100.0))), "the first sight");
        assert!(!w.observe(None), "a blip");
        assert!(!w.observe(Some(Some(100.0))), "back, same process");
        assert!(w.observe(Some(Some(200.0))), "a new process");
        let mut w = RestartWatch::default();
        assert!(!w.observe(None) && !w.observe(None), "not up yet");
        assert!(!w.observe(Some(None)), "first up: nothing to forget");
        assert!(!w.observe(None));
        assert!(!w.observe(Some(None)), "one failed scrape is a blip");
        assert!(!w.observe(None) && !w.observe(None));
        assert!(w.observe(Some(None)), "back after an outage");
    }

    #[test]
    fn parses_vllm_metrics_and_sums_label_sets() {
        let text = "# HELP vllm:num_requests_running Number of requests\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 7\n\
            vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25 1700000000\n\
            vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75\n\
            vllm:prefix_cache_hits_total{engine=\"0\"} 100\n\
            vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"8192\",engine=\"0\"} 1.0\n\
            vllm:cache_config_info{engine=\"1\",num_gpu_blocks=\"100\"} 1.0\n";
        let l = parse_metrics(text).unwrap();
        assert_eq!((l.running, l.waiting), (5, 7));
        assert!((l.kv_usage - 0.5).abs() < 1e-6);
        assert!(l.engine_up);
        assert_eq!(l.capacity_blocks, 8292, "summed over the engines");
    }

    #[test]
    fn sums_a_counter_over_label_sets_and_skips_longer_names() {
        let text = "# TYPE vllm:prompt_tokens_total counter\n\
            vllm:prompt_tokens_total{engine=\"0\"} 100.0\n\
            vllm:prompt_tokens_total{engine=\"1\"} 20\n\
            vllm:prompt_tokens_total_created 5\n";
        assert_eq!(sum_of(text, "vllm:prompt_tokens_total"), Some(120.0));
        assert_eq!(sum_of("up 1\n", "vllm:prompt_tokens_total"), None);
        assert_eq!(sum_of("x 3\n", "x"), Some(3.0));
    }

    #[test]
    fn a_view_is_partial_when_known_blocks_cannot_cover_the_usage() {
        let l = Load {
            running: 4,
            kv_usage: 0.51,
            engine_up: true,
            capacity_blocks: 8_192,
            ..Default::default()
        };
        // 4,177 in use; 5% of capacity (409) and 4 running are slack.
        assert!(
            view_is_partial(&l, 0),
            "a restarted agent beside a warm engine"
        );
        assert!(view_is_partial(&l, 3_700));
        assert!(!view_is_partial(&l, 3_800));
        assert!(!view_is_partial(
            &Load {
                capacity_blocks: 0,
                ..l
            },
            0
        ));
        assert!(!view_is_partial(
            &Load {
                engine_up: false,
                ..l
            },
            0
        ));
    }

    #[test]
    fn no_metrics_or_junk_is_none() {
        assert_eq!(parse_metrics("up 1\n"), None);
        assert_eq!(
            parse_metrics("vllm:num_requests_running{a=\"}\"} nan-ish\n"),
            None
        );
        let l = parse_metrics("vllm:num_requests_waiting -4\n").unwrap();
        assert_eq!(l.waiting, 0, "negative clamps to 0");
    }
}
