//! The comparison as tables: the markdown of results.md and report.html,
//! with the trace's hit-rate references once above it, and the console's
//! narrow summary.

use super::StrategyReport;

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

/// The console's table: the main numbers, aligned, in at most
/// [`CONSOLE_WIDTH`] columns.
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

/// The widest line [`console`] writes for the demo's strategies.
pub const CONSOLE_WIDTH: usize = 120;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::compare::driver::Sample;
    use crate::compare::report::aggregate;
    use crate::optimum::Optimum;

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
                l.chars().count() <= CONSOLE_WIDTH,
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
            reference: 0.883,
            lru_oracle: Some(0.858),
            lru_pinned: Some(0.864),
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
        let refs =
            "ceiling 95.0%, bound 91.1%, reference 88.3%, LRU oracle 85.8%, LRU pinned 86.4%";
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
