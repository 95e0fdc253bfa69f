//! What a `compare` run reports per strategy ([`StrategyReport`], the numbers
//! every output is written from), aggregated from its samples, and the
//! trace's hit-rate ceiling, and the tables: the markdown of results.md and
//! report.html (the references once above it) and the console's narrow one.

use super::driver::Sample;
use crate::stats::{ratio, share_min_max, Summary};
use serde::Serialize;
use std::collections::BTreeMap;

/// Index fidelity: the router's predicted cached tokens vs the engine's.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Fidelity {
    /// Requests with both numbers.
    pub samples: usize,
    /// Share of them where prediction == engine, %.
    pub exact_pct: f64,
    /// 100 * (1 - sum |predicted - engine| / sum max(predicted, engine)).
    pub token_agreement_pct: f64,
    /// Requests where the engine had more cached than predicted (a prefill
    /// finished between the query and this request's own).
    pub under_predicted: usize,
    /// Cached tokens the index missed, summed over `under_predicted`.
    pub under_tokens: u64,
    /// Requests where the engine had less cached than predicted (evicted).
    pub over_predicted: usize,
    /// Predicted tokens the engine lacked, summed over `over_predicted`.
    pub over_tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RatePoint {
    /// Offered arrivals per second.
    pub rate: f64,
    /// P90 TTFT at that rate, ms.
    pub ttft_p90_ms: f64,
    pub failures: usize,
    pub ok: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct StrategyReport {
    pub strategy: String,
    /// Offered rate of the main run, req/s.
    pub rate: f64,
    pub requests: usize,
    pub failures: usize,
    /// Cached prompt tokens / prompt tokens (engines' `cached_tokens`).
    pub hit_rate: f64,
    /// The same from the engines' `/metrics`, as a cross-check.
    pub engine_hit_rate: Option<f64>,
    /// The hit rate a perfect router with unlimited cache could reach.
    pub hit_ceiling: Option<f64>,
    /// Offline references (see [`crate::optimum::LEGEND`]).
    pub optimum: Option<crate::optimum::Optimum>,
    /// Time to first token, ms.
    pub ttft_ms: Summary,
    /// End-to-end latency, ms.
    pub e2e_ms: Summary,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    /// Smallest and largest per-instance share, %.
    pub share_min_pct: f64,
    pub share_max_pct: f64,
    /// Requests per backend.
    pub shares: BTreeMap<String, u64>,
    /// Requests per routing decision kind.
    pub decisions: BTreeMap<String, u64>,
    pub fidelity: Option<Fidelity>,
    /// Highest searched rate with P90 TTFT under the SLO, req/s.
    pub goodput_rps: Option<f64>,
    pub rate_search: Vec<RatePoint>,
    /// (second, hit rate of requests completed in it).
    pub hit_over_time: Vec<(f64, f64)>,
    /// TTFT CDF points (ms, fraction).
    pub ttft_cdf: Vec<(f64, f64)>,
}

/// Aggregates one run.
pub fn aggregate(
    strategy: &str,
    rate: f64,
    samples: &[Sample],
    block_size: u64,
    instances: &[String],
) -> StrategyReport {
    let ok: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.error.is_none() && s.ttft_ms.is_some())
        .collect();
    let failures = samples.len() - ok.len();
    let prompt: u64 = ok.iter().map(|s| s.prompt_tokens).sum();
    let cached: u64 = ok.iter().map(|s| s.cached_tokens).sum();
    let ttft: Vec<f64> = ok.iter().filter_map(|s| s.ttft_ms).collect();
    let e2e: Vec<f64> = ok.iter().filter_map(|s| s.e2e_ms).collect();
    let first = samples
        .iter()
        .map(|s| s.arrival_s)
        .fold(f64::INFINITY, f64::min);
    let last = ok.iter().map(|s| s.done_s).fold(0.0, f64::max);
    let span = (last - first.min(last)).max(1e-9);
    let mut shares: BTreeMap<String, u64> = instances.iter().map(|i| (i.clone(), 0)).collect();
    let mut decisions = BTreeMap::new();
    for s in &ok {
        if let Some(b) = &s.backend {
            *shares.entry(b.clone()).or_default() += 1;
        }
        if let Some(d) = &s.decision {
            *decisions.entry(d.clone()).or_default() += 1;
        }
    }
    let counts: Vec<u64> = shares.values().copied().collect();
    let (share_min_pct, share_max_pct) = share_min_max(&counts);
    StrategyReport {
        strategy: strategy.to_owned(),
        rate,
        requests: samples.len(),
        failures,
        hit_rate: ratio(cached as f64, prompt as f64),
        ttft_ms: Summary::of(&ttft),
        e2e_ms: Summary::of(&e2e),
        throughput_rps: ok.len() as f64 / span,
        output_tokens_per_s: ok.iter().map(|s| s.completion_tokens).sum::<u64>() as f64 / span,
        share_min_pct,
        share_max_pct,
        shares,
        decisions,
        fidelity: fidelity(&ok, block_size),
        hit_over_time: hit_over_time(&ok),
        ttft_cdf: cdf(&ttft, 200),
        ..StrategyReport::default()
    }
}

fn fidelity(ok: &[&Sample], bs: u64) -> Option<Fidelity> {
    let mut f = Fidelity::default();
    let (mut exact, mut diff, mut total) = (0usize, 0u64, 0u64);
    for s in ok {
        let Some(blocks) = s.predicted_blocks else {
            continue;
        };
        // The engine recomputes at least the last prompt token.
        let cap = s.prompt_tokens.saturating_sub(1) / bs.max(1) * bs;
        let predicted = (blocks * bs).min(cap);
        f.samples += 1;
        exact += usize::from(predicted == s.cached_tokens);
        diff += predicted.abs_diff(s.cached_tokens);
        total += predicted.max(s.cached_tokens);
        if s.cached_tokens > predicted {
            f.under_predicted += 1;
            f.under_tokens += s.cached_tokens - predicted;
        } else if s.cached_tokens < predicted {
            f.over_predicted += 1;
            f.over_tokens += predicted - s.cached_tokens;
        }
    }
    if f.samples == 0 {
        return None;
    }
    f.exact_pct = 100.0 * exact as f64 / f.samples as f64;
    f.token_agreement_pct = if total == 0 {
        100.0
    } else {
        100.0 * (1.0 - diff as f64 / total as f64)
    };
    Some(f)
}

/// The hit rate ceiling of a trace: every request whose prefix group was
/// seen before gets, at best, the full blocks of the group's previous prompt
/// (and, in a conversation, answer), capped as the engine caps it; first
/// requests get nothing. Prompt sizes are the engines' (`samples`, trace
/// order). `None` without groups.
pub fn hit_ceiling(
    trace: &[crate::workload::TraceRequest],
    samples: &[Sample],
    block_size: u64,
) -> Option<f64> {
    let bs = block_size.max(1);
    let mut order: Vec<usize> = (0..trace.len().min(samples.len())).collect();
    order.sort_by(|&a, &b| trace[a].arrival.total_cmp(&trace[b].arrival));
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    let (mut prompt, mut best, mut grouped) = (0u64, 0u64, false);
    for i in order {
        let s = &samples[i];
        if s.error.is_some() || s.prompt_tokens == 0 {
            continue;
        }
        prompt += s.prompt_tokens;
        let Some(g) = trace[i].group.as_deref() else {
            continue;
        };
        grouped = true;
        let cap = s.prompt_tokens.saturating_sub(1) / bs * bs;
        if let Some(&prev) = last.get(g) {
            best += (prev / bs * bs).min(cap);
        }
        // The answer's last token is never computed.
        let reusable = if trace[i].conversation().is_some() {
            s.prompt_tokens + s.completion_tokens.saturating_sub(1)
        } else {
            s.prompt_tokens
        };
        last.insert(g, reusable);
    }
    (grouped && prompt > 0).then(|| best as f64 / prompt as f64)
}

fn hit_over_time(ok: &[&Sample]) -> Vec<(f64, f64)> {
    let mut buckets: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for s in ok {
        let b = buckets.entry(s.done_s.max(0.0) as u64).or_default();
        b.0 += s.cached_tokens;
        b.1 += s.prompt_tokens;
    }
    buckets
        .into_iter()
        .filter(|(_, (_, p))| *p > 0)
        .map(|(t, (c, p))| (t as f64, c as f64 / p as f64))
        .collect()
}

fn cdf(values: &[f64], points: usize) -> Vec<(f64, f64)> {
    let s = crate::stats::sorted(values);
    if s.is_empty() {
        return Vec::new();
    }
    let step = (s.len() / points).max(1);
    let mut out: Vec<(f64, f64)> = (0..s.len())
        .step_by(step)
        .map(|i| (s[i], (i + 1) as f64 / s.len() as f64))
        .collect();
    if let Some(&last) = s.last() {
        out.push((last, 1.0));
    }
    out
}

/// The markdown comparison table.
pub fn markdown(reports: &[StrategyReport], slo_ms: f64) -> String {
    // The references are the trace's, the same for every strategy that ran
    // it in full: said once above the table, not in every row.
    let shared = reports.iter().find_map(references);
    let mut t = shared.as_ref().map_or_else(String::new, |refs| {
        format!("Hit-rate references over this run's trace (defined under the table): {refs}\n\n")
    });
    t.push_str(&format!(
        "| strategy | goodput req/s (P90 TTFT <= {slo_ms:.0} ms) | KV hit rate | TTFT P50 ms | P90 | P99 | e2e P50 ms | throughput req/s | tok/s | share min-max % | failures | index fidelity |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    ));
    for r in reports {
        let fid = r.fidelity.as_ref().map_or("-".to_owned(), |f| {
            format!(
                "{:.1}% exact, {:.1}% tokens (n={}, under {}, over {})",
                f.exact_pct, f.token_agreement_pct, f.samples, f.under_predicted, f.over_predicted
            )
        });
        let good = r.goodput_rps.map_or("-".to_owned(), |g| format!("{g:.1}"));
        // A row whose references differ (its run lost requests) keeps its own.
        let own = references(r);
        let hit = if own.is_none() || own == shared {
            format!("{:.1}%", 100.0 * r.hit_rate)
        } else {
            crate::optimum::cell(r.hit_rate, r.hit_ceiling, r.optimum)
        };
        t.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.1}-{:.1} | {} | {} |\n",
            r.strategy, good, hit, r.ttft_ms.p50, r.ttft_ms.p90, r.ttft_ms.p99,
            r.e2e_ms.p50, r.throughput_rps, r.output_tokens_per_s, r.share_min_pct,
            r.share_max_pct, r.failures, fid
        ));
    }
    if reports
        .iter()
        .any(|r| r.hit_ceiling.is_some() || r.optimum.is_some())
    {
        t.push('\n');
        t.push_str(crate::optimum::LEGEND);
        t.push('\n');
    }
    t
}

/// The hit-rate references of `r` less the hit rate ("ceiling 95.0%, ...").
fn references(r: &StrategyReport) -> Option<String> {
    let cell = crate::optimum::cell(0.0, r.hit_ceiling, r.optimum);
    Some(cell.strip_prefix("0.0% (")?.strip_suffix(')')?.to_owned())
}

/// The console's table: the main numbers, aligned, in at most 120 columns.
pub fn console(reports: &[StrategyReport], slo_ms: f64) -> String {
    let head =
        "strategy|goodput|hit %|ceiling|TTFT p50/p90/p99 ms|e2e p50|req/s|tok/s|share %|fail";
    let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.1}", 100.0 * v));
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            let (t, e) = (r.ttft_ms, r.e2e_ms);
            vec![
                r.strategy.clone(),
                r.goodput_rps.map_or("-".to_owned(), |g| format!("{g:.1}")),
                pct(Some(r.hit_rate)),
                pct(r.hit_ceiling),
                format!("{:.0}/{:.0}/{:.0}", t.p50, t.p90, t.p99),
                format!("{:.0}", e.p50),
                format!("{:.2}", r.throughput_rps),
                format!("{:.0}", r.output_tokens_per_s),
                format!("{:.1}-{:.1}", r.share_min_pct, r.share_max_pct),
                r.failures.to_string(),
            ]
        })
        .collect();
    let head: Vec<String> = head.split('|').map(str::to_owned).collect();
    let mut widths = vec![0; head.len()];
    for row in rows.iter().chain([&head]) {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut t = String::new();
    for row in [&head].into_iter().chain(&rows) {
        let cells = row.iter().zip(&widths).enumerate();
        let padded: Vec<String> = cells
            .map(|(i, (c, &w))| match i {
                0 => format!("{c:<w$}"),
                _ => format!("{c:>w$}"),
            })
            .collect();
        t.push_str(padded.join("  ").trim_end());
        t.push('\n');
    }
    t.push_str(&format!(
        "goodput: the highest searched req/s with P90 TTFT <= {slo_ms:.0} ms\n\
         the full table (hit-rate bounds, index fidelity) is in results.md and report.html\n"
    ));
    t
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::optimum::Optimum;

    fn sample(backend: &str, cached: u64, predicted: Option<u64>, ttft: f64) -> Sample {
        Sample {
            arrival_s: 0.0,
            ttft_ms: Some(ttft),
            e2e_ms: Some(ttft + 10.0),
            done_s: 1.5,
            prompt_tokens: 100,
            cached_tokens: cached,
            completion_tokens: 4,
            backend: Some(backend.into()),
            decision: Some("kv_match".into()),
            predicted_blocks: predicted,
            replica: 0,
            error: None,
        }
    }

    #[test]
    fn aggregates_hits_shares_and_fidelity() {
        let mut s = vec![
            sample("a", 96, Some(6), 10.0),
            sample("a", 0, Some(0), 50.0),
            sample("b", 48, Some(2), 20.0),
        ];
        s.push(Sample {
            error: Some("HTTP 500".into()),
            ..Sample::default()
        });
        let r = aggregate(
            "kv_aware",
            1.0,
            &s,
            16,
            &["a".into(), "b".into(), "c".into()],
        );
        assert_eq!(r.requests, 4);
        assert_eq!(r.failures, 1);
        assert!((r.hit_rate - 144.0 / 300.0).abs() < 1e-9);
        assert_eq!(r.shares["c"], 0);
        assert_eq!(r.share_min_pct, 0.0);
        let f = r.fidelity.clone().unwrap();
        assert_eq!(f.samples, 3);
        // 6 blocks = 96 tokens == 96; 0 == 0; 2 blocks = 32 != 48.
        assert!((f.exact_pct - 200.0 / 3.0).abs() < 1e-9);
        assert_eq!((f.under_predicted, f.under_tokens), (1, 16));
        assert_eq!(f.over_predicted, 0);
        assert_eq!(r.ttft_ms.p50, 20.0);
        assert!(markdown(&[r], 500.0).contains("| kv_aware |"));
    }

    #[test]
    fn hit_ceiling_counts_the_previous_prompt_of_a_group() {
        let req = |arrival: f64, group: &str| crate::workload::TraceRequest {
            arrival,
            model: "m".into(),
            messages: None,
            prompt: Some("p".into()),
            max_tokens: 4,
            tenant: None,
            tenant_via: None,
            group: Some(group.into()),
        };
        let trace = vec![req(0.0, "a"), req(1.0, "b"), req(2.0, "a"), req(3.0, "a")];
        let mut samples: Vec<Sample> = [100u64, 50, 120, 60]
            .iter()
            .map(|&p| Sample {
                prompt_tokens: p,
                ..sample("x", 0, None, 1.0)
            })
            .collect();
        // a: cold; b: cold; a again: 96 of the first 100; a: 112 of 120,
        // capped at 48 (59 / 16 * 16) by its own 60-token prompt.
        let c = hit_ceiling(&trace, &samples, 16).unwrap();
        assert!((c - (96.0 + 48.0) / 330.0).abs() < 1e-9, "{c}");
        samples[2].error = Some("failed".into());
        let c = hit_ceiling(&trace, &samples, 16).unwrap();
        // The failed request is skipped: the last one compares with the first.
        assert!((c - 48.0 / 210.0).abs() < 1e-9, "{c}");
    }

    #[test]
    fn hit_ceiling_of_a_conversation_counts_the_previous_answer() {
        let turn = |arrival: f64| crate::workload::TraceRequest {
            arrival,
            model: "m".into(),
            messages: Some(vec![crate::workload::ChatMessage::new("user", "hi")]),
            prompt: None,
            max_tokens: 4,
            tenant: None,
            tenant_via: None,
            group: Some(format!("{}7", crate::workload::CONVERSATION_PREFIX)),
        };
        let trace = vec![turn(0.0), turn(1.0)];
        let samples: Vec<Sample> = [(100u64, 40u64), (170, 10)]
            .iter()
            .map(|&(p, c)| Sample {
                prompt_tokens: p,
                completion_tokens: c,
                ..sample("x", 0, None, 1.0)
            })
            .collect();
        // Turn 2 may reuse turn 1's prompt and answer: 100 + 40 - 1 = 139
        // tokens, 128 in full blocks (a plain group would give 96).
        let c = hit_ceiling(&trace, &samples, 16).unwrap();
        assert!((c - 128.0 / 270.0).abs() < 1e-9, "{c}");
    }

    fn report(strategy: &str) -> StrategyReport {
        let s = Sample {
            ttft_ms: Some(10.0),
            e2e_ms: Some(20.0),
            done_s: 1.5,
            prompt_tokens: 100,
            cached_tokens: 96,
            completion_tokens: 4,
            backend: Some("a".into()),
            ..Sample::default()
        };
        aggregate(strategy, 1.0, &[s], 16, &["a".into()])
    }

    #[test]
    fn the_console_table_fits_120_columns_with_wide_numbers() {
        let mut r = report("least_outstanding");
        r.ttft_ms.p50 = 123_456.0;
        r.ttft_ms.p90 = 234_567.0;
        r.ttft_ms.p99 = 345_678.0;
        r.e2e_ms.p50 = 456_789.0;
        r.goodput_rps = Some(1234.5);
        r.hit_ceiling = Some(0.987);
        r.output_tokens_per_s = 123_456.0;
        r.failures = 100_000;
        let t = console(&[r.clone(), r], 10_000.0);
        let lines: Vec<&str> = t.lines().collect();
        for l in &lines {
            assert!(
                l.chars().count() <= 120,
                "{} columns: {l}",
                l.chars().count()
            );
        }
        assert!(
            lines[0].starts_with("strategy") && lines[1].starts_with("least_outstanding"),
            "{t}"
        );
        assert!(
            t.contains("123456/234567/345678") && t.contains("98.7"),
            "{t}"
        );
        assert!(t.contains("results.md"), "{t}");
    }

    #[test]
    fn the_references_stand_once_above_the_rows() {
        let o = Optimum {
            bound: 0.911,
            lru_oracle: Some(0.858),
        };
        let mut rs: Vec<StrategyReport> = ["random", "kv_aware", "short"]
            .into_iter()
            .map(|s| {
                let mut r = report(s);
                r.hit_ceiling = Some(0.95);
                r.optimum = Some(o);
                r
            })
            .collect();
        // A run that lost requests saw a different trace: its row says so.
        rs[2].hit_ceiling = Some(0.9);
        let md = markdown(&rs, 500.0);
        let refs = "ceiling 95.0%, bound 91.1%, LRU oracle 85.8%";
        let (above, table) = md.split_once("| strategy").unwrap();
        assert_eq!(above.matches(refs).count(), 1, "{md}");
        assert!(!table.contains(refs), "{md}");
        assert!(md.contains("| random | - | 96.0% |") && md.contains("| kv_aware | - | 96.0% |"));
        assert!(
            md.contains("| short | - | 96.0% (ceiling 90.0%, bound 91.1%"),
            "{md}"
        );
        // Without references: no line above, plain rates.
        let md = markdown(&[report("random")], 500.0);
        assert!(
            md.starts_with("| strategy") && md.contains("| 96.0% |"),
            "{md}"
        );
    }
}
