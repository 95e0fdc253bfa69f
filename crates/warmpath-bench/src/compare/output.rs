//! The report files of a `compare` run: results.json, results.md, the SVG
//! plots and report.html (the tables from `report`, the plots from `plot`).

use super::plot;
use super::report::{markdown, StrategyReport};
use crate::error::{io, BenchError};
use std::path::{Path, PathBuf};

/// Writes results.json, replicas.json, results.md, the SVG plots and report.html into
/// `dir`; returns the HTML report's path.
pub(super) fn write_all(
    dir: &Path,
    reports: &[StrategyReport],
    replicas: &impl serde::Serialize,
    settings: &serde_json::Value,
    slo_ms: f64,
) -> Result<PathBuf, BenchError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let json = serde_json::json!({"settings": settings, "strategies": reports});
    let text = serde_json::to_string_pretty(&json).unwrap_or_default();
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).map_err(io(&p))
    };
    write("results.json", &text)?;
    write(
        "replicas.json",
        &serde_json::to_string_pretty(replicas).unwrap_or_default(),
    )?;
    let md = markdown(reports, slo_ms);
    write("results.md", &md)?;
    let cdf = plot::ttft_cdf(reports);
    let hits = plot::hit_over_time(reports);
    let shares = plot::shares(reports);
    write("ttft_cdf.svg", &cdf)?;
    write("hit_rate.svg", &hits)?;
    write("share.svg", &shares)?;
    let html = plot::html(&md, &[&cdf, &hits, &shares], &text);
    write("report.html", &html)?;
    Ok(dir.join("report.html"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::compare::driver::Sample;
    use crate::compare::report::aggregate;
    use crate::optimum::{Optimum, LEGEND};

    #[test]
    fn every_report_file_shows_the_bound_and_the_lru_references() {
        let samples: Vec<Sample> = (0..4)
            .map(|i| Sample {
                arrival_s: f64::from(i),
                done_s: f64::from(i) + 0.5,
                ttft_ms: Some(10.0),
                e2e_ms: Some(20.0),
                prompt_tokens: 100,
                cached_tokens: 48,
                completion_tokens: 4,
                backend: Some("sim-0".into()),
                ..Sample::default()
            })
            .collect();
        let mut r = aggregate("kv_aware", 1.0, &samples, 16, &["sim-0".into()]);
        r.hit_ceiling = Some(0.95);
        r.optimum = Some(Optimum {
            bound: 0.911,
            reference: 0.883,
            lru_oracle: Some(0.858),
            lru_pinned: Some(0.864),
        });
        let dir = std::env::temp_dir().join(format!("warmpath-report-{}", std::process::id()));
        write_all(
            &dir,
            &[r],
            &serde_json::json!([]),
            &serde_json::json!({}),
            500.0,
        )
        .unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let (md, html, svg) = (
            read("results.md"),
            read("report.html"),
            read("hit_rate.svg"),
        );
        let json: serde_json::Value = serde_json::from_str(&read("results.json")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        // The references once, above the table; the row has the hit rate.
        let refs =
            "ceiling 95.0%, bound 91.1%, reference 88.3%, LRU oracle 85.8%, LRU pinned 86.4%";
        assert!(
            md.starts_with("Hit-rate references") && md.contains(&format!("{refs}\n\n| strategy")),
            "{md}"
        );
        assert!(md.contains("| 48.0% |"), "{md}");
        assert!(md.trim_end().ends_with(LEGEND), "{md}");
        assert!(html.contains(&format!("{refs}</p>\n<table>")), "{html}");
        assert!(html.contains("<td>48.0%</td>"), "{html}");
        assert!(html.contains("<p>Hit-rate references"), "{html}");
        let o = &json["strategies"][0]["optimum"];
        assert_eq!(o["bound"], 0.911);
        assert_eq!(o["lru_oracle"], 0.858);
        assert_eq!(o["lru_pinned"], 0.864);
        for line in [
            "optimum bound",
            "optimum reference",
            "LRU oracle",
            "LRU pinned",
        ] {
            assert!(svg.contains(&format!(">{line}</text>")), "{line}: {svg}");
        }
    }
}
