//! The report files of a `compare` run: results.json, results.md, the SVG
//! plots and report.html (the tables from `report`, the plots from `plot`).

use super::plot;
use super::report::{markdown, StrategyReport};
use crate::error::BenchError;
use std::path::{Path, PathBuf};

/// Writes results.json, results.md, the SVG plots and report.html into
/// `dir`; returns the HTML report's path.
pub fn write_all(
    dir: &Path,
    reports: &[StrategyReport],
    settings: &serde_json::Value,
    slo_ms: f64,
) -> Result<PathBuf, BenchError> {
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |e| BenchError::Io { path: p, source: e }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let json = serde_json::json!({"settings": settings, "strategies": reports});
    let text = serde_json::to_string_pretty(&json).map_err(|e| BenchError::Invalid {
        what: "report",
        reason: e.to_string(),
    })?;
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).map_err(io(&p))
    };
    write("results.json", &text)?;
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
