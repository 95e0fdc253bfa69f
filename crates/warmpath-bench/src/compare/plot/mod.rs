//! Hand-written SVG line/bar charts and the self-contained HTML report.
//!
//! Every chart keeps its legend in a column right of the plot area, so no
//! legend covers a curve or a bar; each strategy is a solid colour of its own,
//! each offline reference a dashed line in a colour no strategy uses.

mod axis;
mod page;

use super::report::StrategyReport;
use axis::Ticks;
use page::esc;
pub(super) use page::html;
use std::fmt::Write as _;

const W: f64 = 640.0;
const H: f64 = 360.0;
const PAD: f64 = 50.0;
/// The legend column, right of the plot area.
const LEGEND_W: f64 = 170.0;

/// The x axis: round numbers from 0, or one name under each group.
enum XAxis<'a> {
    Numbers(Ticks),
    Groups(&'a [&'a String]),
}

fn frame(title: &str, x_label: &str, y_label: &str, x: XAxis<'_>, y: Ticks) -> String {
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
    for (f, label) in y.marks() {
        let y = H - PAD - f * (H - 2.0 * PAD);
        let _ = write!(
            s,
            "<text class=\"tick\" x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>\
             <line x1=\"{PAD}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#eee\"/>",
            PAD - 4.0,
            y + 4.0,
            W - PAD / 2.0
        );
    }
    match x {
        XAxis::Numbers(ticks) => {
            for (f, label) in ticks.marks() {
                let _ = write!(
                    s,
                    "<text class=\"tick\" x=\"{:.1}\" y=\"{tick_y}\" text-anchor=\"middle\">{label}</text>",
                    PAD + f * (W - 1.5 * PAD),
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

/// ` stroke-dasharray="..."` for a dashed style, nothing for a solid one.
fn dash_attr(style: Style) -> String {
    style
        .dash
        .map_or_else(String::new, |d| format!(" stroke-dasharray=\"{d}\""))
}

/// Legend entry `k`: a swatch drawn as the series is (solid or dashed) and
/// the name, in the column right of the plot.
fn legend(s: &mut String, k: usize, style: Style, name: &str) {
    let x = W - PAD / 2.0 + 12.0;
    let y = PAD + 16.0 * k as f64;
    let (c, line_y, line_end, text_x) = (style.color, y - 4.0, x + 16.0, x + 20.0);
    let _ = write!(
        s,
        "<line x1=\"{x}\" y1=\"{line_y:.1}\" x2=\"{line_end}\" y2=\"{line_y:.1}\" stroke=\"{c}\" stroke-width=\"3\"{}/>\
         <text class=\"legend\" x=\"{text_x}\" y=\"{y:.1}\" fill=\"{c}\">{}</text>",
        dash_attr(style),
        esc(name)
    );
}

/// Strategies, solid (Tableau's ten less the grey and olive the references
/// take): more than the router's strategies.
const ROUTERS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// References, dashed: dark and muted, unlike every router colour.
const REFERENCES: [&str; 5] = ["#000000", "#7f7f7f", "#bcbd22", "#00525e", "#c49c94"];

/// Dash patterns of the references, one each.
const DASHES: [&str; 5] = ["8 4", "3 3", "12 3 3 3", "1 3", "6 2 1 2"];

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Style {
    color: &'static str,
    /// `stroke-dasharray`; `None` draws solid.
    dash: Option<&'static str>,
}

/// The style of strategy `k` (report order, the same in every chart).
fn router(k: usize) -> Style {
    Style {
        color: ROUTERS[k % ROUTERS.len()],
        dash: None,
    }
}

/// The style of reference line `k`.
fn reference(k: usize) -> Style {
    Style {
        color: REFERENCES[k % REFERENCES.len()],
        dash: Some(DASHES[k % DASHES.len()]),
    }
}

/// One line series: its name, its style and its points.
type Series<'a> = (&'a str, Style, &'a [(f64, f64)]);

fn lines(title: &str, xl: &str, yl: &str, series: &[Series<'_>], y_max: Option<f64>) -> String {
    // The largest of one coordinate over every point.
    let max = |of: fn(&(f64, f64)) -> f64| {
        series
            .iter()
            .flat_map(|(_, _, p)| p.iter().map(of))
            .fold(0.0, f64::max)
    };
    let x = Ticks::new(max(|q| q.0));
    let y = Ticks::new(y_max.unwrap_or_else(|| max(|q| q.1)));
    let (x_top, y_top) = (x.top(), y.top());
    let mut s = frame(title, xl, yl, XAxis::Numbers(x), y);
    for (k, (name, style, pts)) in series.iter().enumerate() {
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    PAD + x / x_top * (W - 1.5 * PAD),
                    H - PAD - (y / y_top).min(1.0) * (H - 2.0 * PAD)
                )
            })
            .collect();
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} points=\"{}\"/>",
            style.color,
            dash_attr(*style),
            path.join(" "),
        );
        legend(&mut s, k, *style, name);
    }
    s.push_str("</svg>");
    s
}

/// TTFT CDF per strategy.
pub(super) fn ttft_cdf(reports: &[StrategyReport]) -> String {
    let series = strategy_series(reports, |r| &r.ttft_cdf);
    lines(
        "TTFT CDF",
        "TTFT (ms)",
        "fraction of requests",
        &series,
        Some(1.0),
    )
}

/// One solid series per strategy.
fn strategy_series(
    reports: &[StrategyReport],
    points: fn(&StrategyReport) -> &[(f64, f64)],
) -> Vec<Series<'_>> {
    let each = reports.iter().enumerate();
    each.map(|(k, r)| (r.strategy.as_str(), router(k), points(r)))
        .collect()
}

/// KV hit rate over time per strategy, and the offline references (of the
/// first report that has them, as the table's line above it) dashed.
pub(super) fn hit_over_time(reports: &[StrategyReport]) -> String {
    let mut series = strategy_series(reports, |r| &r.hit_over_time);
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
            let mut refs = vec![("optimum bound", flat(o.bound))];
            refs.extend(o.lru_oracle.map(|v| ("LRU oracle", flat(v))));
            refs
        })
        .unwrap_or_default();
    series.extend(
        refs.iter()
            .enumerate()
            .map(|(k, (n, p))| (*n, reference(k), &p[..])),
    );
    lines(
        "KV hit rate over time",
        "seconds into the run",
        "hit rate",
        &series,
        Some(1.0),
    )
}

/// Per-instance share of requests, grouped bars per strategy.
pub(super) fn shares(reports: &[StrategyReport]) -> String {
    let instances: Vec<&String> = reports
        .first()
        .map(|r| r.shares.keys().collect())
        .unwrap_or_default();
    let y = Ticks::new(100.0);
    let y_top = y.top();
    let mut s = frame(
        "Share of requests per instance",
        "instance",
        "% of requests",
        XAxis::Groups(&instances),
        y,
    );
    let groups = instances.len().max(1) as f64;
    let gw = (W - 1.5 * PAD) / groups;
    let bw = gw / (reports.len() as f64 + 1.0);
    for (k, r) in reports.iter().enumerate() {
        let total: u64 = r.shares.values().sum::<u64>().max(1);
        let style = router(k);
        let c = style.color;
        for (g, inst) in instances.iter().enumerate() {
            let pct = 100.0 * *r.shares.get(*inst).unwrap_or(&0) as f64 / total as f64;
            let h = pct / y_top * (H - 2.0 * PAD);
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{c}\"><title>{} {}: {pct:.1}%</title></rect>",
                PAD + g as f64 * gw + k as f64 * bw, H - PAD - h, bw * 0.9, esc(&r.strategy), esc(inst)
            );
        }
        legend(&mut s, k, style, &r.strategy);
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

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
            &[("random", router(0), &cdf), ("kv_aware", router(1), &cdf)],
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
        let svg = frame(
            "t",
            "instance",
            "%",
            XAxis::Groups(&names),
            Ticks::new(100.0),
        );
        for n in ["sim-0", "sim-1"] {
            assert!(svg.contains(&format!(">{n}</text>")), "{svg}");
        }
        // No numeric x ticks (0.00, 1.0, ...) on a categorical axis: the five
        // ticks are the y axis' 0..100.
        assert!(!svg.contains(">0.00<") && !svg.contains(">1.0<"), "{svg}");
        assert!(svg.contains(">100<") && svg.contains(">50<"), "{svg}");
        assert_eq!(svg.matches("class=\"tick\"").count(), 5, "{svg}");
    }

    /// The demo's four strategies with a TTFT tail at 597 ms, hit rates and
    /// all four drawn references (bound, reference, two LRU ones).
    fn demo_reports() -> Vec<StrategyReport> {
        use crate::compare::driver::Sample;
        let samples: Vec<Sample> = (0..40)
            .map(|i| Sample {
                arrival_s: f64::from(i),
                done_s: f64::from(i) + 0.5,
                ttft_ms: Some(597.0 * f64::from(i + 1) / 40.0),
                e2e_ms: Some(700.0),
                prompt_tokens: 100,
                cached_tokens: 48,
                completion_tokens: 4,
                backend: Some(format!("sim-{}", i % 3)),
                ..Sample::default()
            })
            .collect();
        let ids = ["sim-0".to_owned(), "sim-1".to_owned(), "sim-2".to_owned()];
        warmpath_core::Strategy::ALL
            .iter()
            .map(|s| {
                let mut r = super::super::report::aggregate(s.as_str(), 1.0, &samples, 16, &ids);
                r.hit_ceiling = Some(0.95);
                r.optimum = Some(crate::optimum::Optimum {
                    bound: 0.911,
                    lru_oracle: Some(0.858),
                });
                r
            })
            .collect()
    }

    /// `attr="..."` of every element opening with `tag`, as text.
    fn texts(svg: &str, tag: &str, attr: &str) -> Vec<String> {
        svg.split(tag)
            .skip(1)
            .filter_map(|e| {
                let rest = e.split(&format!(" {attr}=\"")).nth(1)?;
                Some(rest.split('"').next()?.to_owned())
            })
            .collect()
    }

    #[test]
    fn every_series_of_every_chart_has_its_own_colour() {
        let reports = demo_reports();
        let hits = hit_over_time(&reports);
        let colours = texts(&hits, "<polyline", "stroke");
        // 4 strategies + 2 references (the bound and the LRU oracle).
        assert_eq!(colours.len(), 6, "{hits}");
        let distinct: std::collections::BTreeSet<&String> = colours.iter().collect();
        assert_eq!(distinct.len(), colours.len(), "{colours:?}");
        // The references are dashed, each its own way; the strategies solid.
        let dashes = texts(&hits, "<polyline", "stroke-dasharray");
        assert_eq!(dashes.len(), 2, "{hits}");
        assert_eq!(
            dashes
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            2
        );
        // Legend swatches match their lines, in order.
        let swatches = texts(&hits, "<text class=\"legend\"", "fill");
        assert_eq!(swatches, colours);
        // A strategy keeps its colour from chart to chart.
        let cdf = texts(&ttft_cdf(&reports), "<polyline", "stroke");
        let bars = texts(&shares(&reports), "<text class=\"legend\"", "fill");
        assert_eq!(cdf, colours[..4]);
        assert_eq!(bars, colours[..4]);
    }

    #[test]
    fn the_ttft_axis_ticks_are_round() {
        let svg = ttft_cdf(&demo_reports());
        let ticks: Vec<&str> = svg
            .split("<text class=\"tick\"")
            .skip(1)
            .filter_map(|t| t.split('>').nth(1)?.split('<').next())
            .collect();
        // y: a fraction 0..1; x: the TTFT up to 597 ms.
        assert_eq!(
            ticks,
            ["0", "0.25", "0.5", "0.75", "1", "0", "200", "400", "600"],
            "{svg}"
        );
        // The last point (597 ms) sits short of the axis' end (600 ms).
        let right = points(&svg).iter().map(|p| p.0).fold(0.0, f64::max);
        let axis_end = PAD + (W - 1.5 * PAD);
        assert!(right < axis_end && right > axis_end - 5.0, "{right}");
    }

    /// Writes the demo's report to the temp dir, for a reader to open.
    #[test]
    fn a_rendered_report_has_the_references_once_above_the_table() {
        let reports = demo_reports();
        let md = super::super::report::markdown(&reports, 500.0);
        let (cdf, hits, bars) = (
            ttft_cdf(&reports),
            hit_over_time(&reports),
            shares(&reports),
        );
        let page = html(&md, &[&cdf, &hits, &bars], "{}");
        let path = std::env::temp_dir().join("warmpath-demo-report.html");
        std::fs::write(&path, &page).unwrap();
        for r in ["ceiling 95.0%", "bound 91.1%", "LRU oracle 85.8%"] {
            assert_eq!(page.matches(r).count(), 1, "{r}: {page}");
            assert!(page.find(r) < page.find("<table>"), "{r}: {page}");
        }
        for s in warmpath_core::Strategy::ALL {
            assert!(
                page.contains(&format!(
                    "<tr><td>{}</td><td>-</td><td>48.0%</td>",
                    s.as_str()
                )),
                "{page}"
            );
        }
    }

    #[test]
    fn the_palettes_are_distinct_and_cover_every_series() {
        let all: BTreeSet<&str> = ROUTERS.iter().chain(&REFERENCES).copied().collect();
        assert_eq!(all.len(), ROUTERS.len() + REFERENCES.len());
        assert!(ROUTERS.len() >= warmpath_core::Strategy::ALL.len());
        // Four references are drawn today (bound, reference, two LRU ones),
        // plus room for the ceiling.
        assert!(REFERENCES.len() >= 5 && DASHES.len() >= REFERENCES.len());
        assert_eq!(DASHES.iter().collect::<BTreeSet<_>>().len(), DASHES.len());
    }
}
