//! The self-contained HTML report: the markdown table as an HTML table (its
//! paragraphs where the markdown has them), the plots, the raw JSON.

use std::fmt::Write as _;

/// `s` safe as HTML or SVG text and attribute values.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The report's markdown (table and notes) as HTML, in order: a
/// paragraph above the table stays above it (the references), one below
/// stays below (their legend).
fn body(markdown: &str) -> String {
    let mut out = String::new();
    // Rows so far of the table being read; the first is the header.
    let mut rows: Option<usize> = None;
    for line in markdown.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            if rows.take().is_some() {
                out.push_str("</table>\n");
            }
            if !line.is_empty() {
                let _ = writeln!(out, "<p>{}</p>", esc(line));
            }
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        // The `|---|---|` line under the header.
        if cells
            .iter()
            .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':')))
        {
            continue;
        }
        let n = rows.get_or_insert_with(|| {
            out.push_str("<table>\n");
            0
        });
        let tag = if *n == 0 { "th" } else { "td" };
        *n += 1;
        out.push_str("<tr>");
        for c in cells {
            let _ = write!(out, "<{tag}>{}</{tag}>", esc(c));
        }
        out.push_str("</tr>\n");
    }
    if rows.is_some() {
        out.push_str("</table>\n");
    }
    out
}

/// One self-contained HTML page: the table, the plots and the raw JSON.
pub(crate) fn html(markdown: &str, svgs: &[&str], json: &str) -> String {
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>warmpath comparison</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}\
         th{{background:#f4f4f4}}pre{{background:#f8f8f8;padding:1em;overflow:auto;max-height:30em}}</style></head><body>\
         <h1>warmpath: routing strategies compared</h1>\n{}{}<h2>Raw results</h2><pre>{}</pre></body></html>",
        body(markdown),
        svgs.iter().map(|s| format!("<div>{s}</div>")).collect::<String>(),
        esc(json)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_keep_their_place_around_the_table() {
        let md = "above\n\n| a | b |\n|---|---|\n| 1 | <2> |\n\nbelow\n";
        let b = body(md);
        assert_eq!(
            b,
            "<p>above</p>\n<table>\n<tr><th>a</th><th>b</th></tr>\n\
             <tr><td>1</td><td>&lt;2&gt;</td></tr>\n</table>\n<p>below</p>\n"
        );
        let page = html(md, &["<svg/>"], "{\"x\": \"<\"}");
        assert!(page.contains("<div><svg/></div>") && page.contains("&quot;x&quot;"));
    }
}
