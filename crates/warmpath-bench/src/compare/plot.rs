//! Hand-written SVG line/bar charts and the self-contained HTML report.

use super::report::StrategyReport;
use std::fmt::Write as _;

const W: f64 = 640.0;
const H: f64 = 360.0;
const PAD: f64 = 50.0;
const COLORS: [&str; 6] = [
    "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn frame(title: &str, x_label: &str, y_label: &str, x_max: f64, y_max: f64) -> String {
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">{}</text>\
         <line x1=\"{PAD}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{}\" stroke=\"black\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
         <text x=\"14\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {})\">{}</text>",
        W / 2.0, esc(title), H - PAD, W - PAD / 2.0, H - PAD, H - PAD,
        W / 2.0, H - 12.0, esc(x_label), H / 2.0, H / 2.0, esc(y_label)
    );
    for i in 0..=4 {
        let f = f64::from(i) / 4.0;
        let x = PAD + f * (W - 1.5 * PAD);
        let y = H - PAD - f * (H - 2.0 * PAD);
        let _ = write!(
            s,
            "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <line x1=\"{PAD}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#eee\"/>",
            H - PAD + 14.0,
            short(f * x_max),
            PAD - 4.0,
            y + 4.0,
            short(f * y_max),
            W - PAD / 2.0
        );
    }
    s
}

fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn lines(
    title: &str,
    xl: &str,
    yl: &str,
    series: &[(&str, &[(f64, f64)])],
    y_max: Option<f64>,
) -> String {
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(0.0, f64::max)
        .max(1e-9);
    let y_max = y_max.unwrap_or_else(|| {
        series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.1))
            .fold(0.0, f64::max)
            .max(1e-9)
    });
    let mut s = frame(title, xl, yl, x_max, y_max);
    for (k, (name, pts)) in series.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    PAD + x / x_max * (W - 1.5 * PAD),
                    H - PAD - (y / y_max).min(1.0) * (H - 2.0 * PAD)
                )
            })
            .collect();
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>\
             <text x=\"{}\" y=\"{}\" fill=\"{c}\">{}</text>",
            path.join(" "),
            PAD + 10.0,
            PAD + 14.0 * k as f64,
            esc(name)
        );
    }
    s.push_str("</svg>");
    s
}

/// TTFT CDF per strategy.
pub fn ttft_cdf(reports: &[StrategyReport]) -> String {
    let series: Vec<(&str, &[(f64, f64)])> = reports
        .iter()
        .map(|r| (r.strategy.as_str(), r.ttft_cdf.as_slice()))
        .collect();
    lines(
        "TTFT CDF",
        "TTFT (ms)",
        "fraction of requests",
        &series,
        Some(1.0),
    )
}

/// KV hit rate over time per strategy.
pub fn hit_over_time(reports: &[StrategyReport]) -> String {
    let mut series: Vec<(&str, &[(f64, f64)])> = reports
        .iter()
        .map(|r| (r.strategy.as_str(), r.hit_over_time.as_slice()))
        .collect();
    // The offline references as flat lines across the run.
    let end = reports
        .iter()
        .flat_map(|r| r.hit_over_time.iter().map(|p| p.0))
        .fold(0.0, f64::max);
    let refs: Vec<(&str, [(f64, f64); 2])> = reports
        .iter()
        .find_map(|r| r.optimum)
        .map(|o| {
            vec![
                ("optimum bound", [(0.0, o.bound), (end, o.bound)]),
                (
                    "optimum reference",
                    [(0.0, o.reference), (end, o.reference)],
                ),
            ]
        })
        .unwrap_or_default();
    series.extend(refs.iter().map(|(n, p)| (*n, &p[..])));
    lines(
        "KV hit rate over time",
        "seconds into the run",
        "hit rate",
        &series,
        Some(1.0),
    )
}

/// Per-instance share of requests, grouped bars per strategy.
pub fn shares(reports: &[StrategyReport]) -> String {
    let instances: Vec<&String> = reports
        .first()
        .map(|r| r.shares.keys().collect())
        .unwrap_or_default();
    let mut s = frame(
        "Share of requests per instance",
        "instance",
        "% of requests",
        instances.len().max(1) as f64,
        100.0,
    );
    let groups = instances.len().max(1) as f64;
    let gw = (W - 1.5 * PAD) / groups;
    let bw = gw / (reports.len() as f64 + 1.0);
    for (k, r) in reports.iter().enumerate() {
        let total: u64 = r.shares.values().sum::<u64>().max(1);
        let c = COLORS[k % COLORS.len()];
        for (g, inst) in instances.iter().enumerate() {
            let pct = 100.0 * *r.shares.get(*inst).unwrap_or(&0) as f64 / total as f64;
            let h = pct / 100.0 * (H - 2.0 * PAD);
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{c}\"><title>{} {}: {pct:.1}%</title></rect>",
                PAD + g as f64 * gw + k as f64 * bw, H - PAD - h, bw * 0.9, esc(&r.strategy), esc(inst)
            );
        }
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{}</text>",
            W - 160.0,
            PAD + 14.0 * k as f64,
            esc(&r.strategy)
        );
    }
    s.push_str("</svg>");
    s
}

/// One self-contained HTML page: the table, the plots and the raw JSON.
pub fn html(markdown: &str, svgs: &[&str], json: &str) -> String {
    let mut rows = String::new();
    for (i, line) in markdown.lines().enumerate() {
        if i == 1 || line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let tag = if i == 0 { "th" } else { "td" };
        rows.push_str("<tr>");
        for c in cells {
            let _ = write!(rows, "<{tag}>{}</{tag}>", esc(c));
        }
        rows.push_str("</tr>\n");
    }
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>warmpath comparison</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}\
         th{{background:#f4f4f4}}pre{{background:#f8f8f8;padding:1em;overflow:auto;max-height:30em}}</style></head><body>\
         <h1>warmpath: routing strategies compared</h1><table>{rows}</table>{}<h2>Raw results</h2><pre>{}</pre></body></html>",
        svgs.iter().map(|s| format!("<div>{s}</div>")).collect::<String>(),
        esc(json)
    )
}
