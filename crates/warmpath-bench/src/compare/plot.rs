//! Hand-written SVG line/bar charts and the self-contained HTML report.
//!
//! Every chart keeps its legend in a column right of the plot area, so no
//! legend covers a curve or a bar.

use super::report::StrategyReport;
use std::fmt::Write as _;

const W: f64 = 640.0;
const H: f64 = 360.0;
const PAD: f64 = 50.0;
/// The legend column, right of the plot area.
const LEGEND_W: f64 = 170.0;
const COLORS: [&str; 6] = [
    "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The x axis: numbers from 0 to a maximum, or one name under each group.
enum XAxis<'a> {
    Numbers(f64),
    Groups(&'a [&'a String]),
}

fn frame(title: &str, x_label: &str, y_label: &str, x: XAxis<'_>, y_max: f64) -> String {
    let total_w = W + LEGEND_W;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{total_w}\" height=\"{H}\" viewBox=\"0 0 {total_w} {H}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">{}</text>\
         <line x1=\"{PAD}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{}\" stroke=\"black\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
         <text x=\"14\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {})\">{}</text>",
        W / 2.0, esc(title), H - PAD, W - PAD / 2.0, H - PAD, H - PAD,
        W / 2.0, H - 12.0, esc(x_label), H / 2.0, H / 2.0, esc(y_label)
    );
    let tick_y = H - PAD + 14.0;
    for i in 0..=4 {
        let f = f64::from(i) / 4.0;
        let y = H - PAD - f * (H - 2.0 * PAD);
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <line x1=\"{PAD}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#eee\"/>",
            PAD - 4.0,
            y + 4.0,
            short(f * y_max),
            W - PAD / 2.0
        );
    }
    match x {
        XAxis::Numbers(x_max) => {
            for i in 0..=4 {
                let f = f64::from(i) / 4.0;
                let _ = write!(
                    s,
                    "<text x=\"{:.1}\" y=\"{tick_y}\" text-anchor=\"middle\">{}</text>",
                    PAD + f * (W - 1.5 * PAD),
                    short(f * x_max)
                );
            }
        }
        XAxis::Groups(names) => {
            let gw = (W - 1.5 * PAD) / names.len().max(1) as f64;
            for (g, name) in names.iter().enumerate() {
                let _ = write!(
                    s,
                    "<text x=\"{:.1}\" y=\"{tick_y}\" text-anchor=\"middle\">{}</text>",
                    PAD + (g as f64 + 0.5) * gw,
                    esc(name)
                );
            }
        }
    }
    s
}

/// Legend entry `k`: a swatch and the name, in the column right of the plot.
fn legend(s: &mut String, k: usize, color: &str, name: &str) {
    let x = W - PAD / 2.0 + 12.0;
    let y = PAD + 16.0 * k as f64;
    let _ = write!(
        s,
        "<rect x=\"{x}\" y=\"{:.1}\" width=\"14\" height=\"4\" fill=\"{color}\"/>\
         <text class=\"legend\" x=\"{}\" y=\"{y:.1}\" fill=\"{color}\">{}</text>",
        y - 5.0,
        x + 18.0,
        esc(name)
    );
}

fn short(v: f64) -> String {
    if v == 0.0 {
        "0".to_owned()
    } else if v >= 100.0 {
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
    let mut s = frame(title, xl, yl, XAxis::Numbers(x_max), y_max);
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
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" "),
        );
        legend(&mut s, k, c, name);
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
            let flat = |v: f64| [(0.0, v), (end, v)];
            let mut refs = vec![
                ("optimum bound", flat(o.bound)),
                ("optimum reference", flat(o.reference)),
            ];
            refs.extend(o.lru_oracle.map(|v| ("LRU oracle", flat(v))));
            refs.extend(o.lru_pinned.map(|v| ("LRU pinned", flat(v))));
            refs
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
        XAxis::Groups(&instances),
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
        legend(&mut s, k, c, &r.strategy);
    }
    s.push_str("</svg>");
    s
}

/// One self-contained HTML page: the table, the plots and the raw JSON.
pub fn html(markdown: &str, svgs: &[&str], json: &str) -> String {
    let mut rows = String::new();
    let mut notes = String::new();
    for (i, line) in markdown.lines().enumerate() {
        if i == 1 || line.trim().is_empty() {
            continue;
        }
        // Lines outside the table (the references' legend) are paragraphs.
        if !line.starts_with('|') {
            let _ = write!(notes, "<p>{}</p>", esc(line));
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
         <h1>warmpath: routing strategies compared</h1><table>{rows}</table>{notes}{}<h2>Raw results</h2><pre>{}</pre></body></html>",
        svgs.iter().map(|s| format!("<div>{s}</div>")).collect::<String>(),
        esc(json)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The numbers of every `attr="..."` of the elements opening with `tag`.
    fn attrs(svg: &str, tag: &str, attr: &str) -> Vec<f64> {
        svg.split(tag)
            .skip(1)
            .filter_map(|e| {
                let rest = e.split(&format!(" {attr}=\"")).nth(1)?;
                rest.split('"').next()?.parse().ok()
            })
            .collect()
    }

    fn points(svg: &str) -> Vec<(f64, f64)> {
        svg.split("points=\"")
            .skip(1)
            .flat_map(|p| {
                p.split('"')
                    .next()
                    .unwrap()
                    .split(' ')
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .map(|xy| {
                let (x, y) = xy.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn legends_sit_right_of_every_curve() {
        let cdf: Vec<(f64, f64)> = (0..=10)
            .map(|i| (f64::from(i) * 10.0, f64::from(i) / 10.0))
            .collect();
        let svg = lines(
            "t",
            "x",
            "y",
            &[("random", &cdf), ("kv_aware", &cdf)],
            Some(1.0),
        );
        let right = points(&svg).iter().map(|p| p.0).fold(0.0, f64::max);
        let legend_x = attrs(&svg, "<text class=\"legend\"", "x");
        assert_eq!(legend_x.len(), 2, "{svg}");
        assert!(
            legend_x.iter().all(|&x| x > right),
            "{legend_x:?} vs {right}: {svg}"
        );
        assert!(svg.contains(&format!("width=\"{}\"", W + LEGEND_W)));
    }

    #[test]
    fn the_share_axis_names_the_instances() {
        let mut shares = std::collections::BTreeMap::new();
        shares.insert("sim-0".to_owned(), 3u64);
        shares.insert("sim-1".to_owned(), 1u64);
        let names: Vec<&String> = shares.keys().collect();
        let svg = frame("t", "instance", "%", XAxis::Groups(&names), 100.0);
        for n in ["sim-0", "sim-1"] {
            assert!(svg.contains(&format!(">{n}</text>")), "{svg}");
        }
        // No numeric x ticks (0.00, 1.0, ...) on a categorical axis; the y
        // axis keeps 0..100.
        assert!(!svg.contains(">0.00<") && !svg.contains(">1.0<"), "{svg}");
        assert!(svg.contains(">100<") && svg.contains(">50.0<"), "{svg}");
    }
}
