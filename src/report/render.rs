//! What a simulation writes: the summary (stdout and `summary.json`), the
//! series (`series.csv`, `series.json`) and `report.html`, one
//! self-contained page with an SVG plot per rule and scenario (plotters).

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use super::{Bin, RuleResult, ScenarioResult};

/// The summary as people read it.
pub(crate) fn summary_text(outcomes: &[ScenarioResult]) -> String {
    let mut out = String::new();
    for o in outcomes {
        let share = |n: u64, of: u64| {
            if of == 0 {
                0.0
            } else {
                100.0 * n as f64 / of as f64
            }
        };
        let _ = writeln!(
            out,
            "== {}: {} requests, {} refused ({:.1} %)",
            printable(&o.scenario),
            o.requests,
            o.refused,
            share(o.refused, o.requests)
        );
        if o.not_replayed > 0 {
            let _ = writeln!(
                out,
                "   {} requests not replayed: the server would refuse them ({})",
                o.not_replayed,
                printable(o.not_replayed_why.as_deref().unwrap_or("invalid"))
            );
        }
        for r in &o.rules {
            let _ = writeln!(
                out,
                "  {}  {}: {} requests, {} admitted, {} refused ({:.1} %), peak {:.0} % of the limit",
                printable(&r.label()),
                r.limit,
                r.requests,
                r.admitted,
                r.refused,
                share(r.refused, r.requests),
                100.0 * r.peak_usage
            );
            if r.tagged > 0 {
                let _ = writeln!(
                    out,
                    "    over its soft limit (over_limit: tag), admitted and tagged: {} ({:.1} %)",
                    r.tagged,
                    share(r.tagged, r.requests)
                );
            }
            if !r.top_refused.is_empty() {
                let top: Vec<String> = r
                    .top_refused
                    .iter()
                    .take(5)
                    .map(|(client, n)| format!("{} ({n})", printable(client)))
                    .collect();
                let _ = writeln!(out, "    refused most: {}", top.join(", "));
            }
        }
    }
    out
}

/// `summary.json`: per scenario, per rule.
pub(crate) fn summary_json(outcomes: &[ScenarioResult]) -> serde_json::Value {
    serde_json::json!({ "scenarios": outcomes })
}

/// `series.csv`: scenario, rule, bin start (seconds from the first event),
/// requests, admitted, refused.
pub(crate) fn series_csv(outcomes: &[ScenarioResult]) -> String {
    let mut out = String::from("scenario,rule,second,requests,admitted,refused\n");
    for o in outcomes {
        for r in &o.rules {
            for (i, b) in r.series.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{},{},{},{},{},{}",
                    csv(&o.scenario),
                    csv(&r.rule),
                    i as f64 * o.bin_seconds,
                    b.requests,
                    b.requests - b.refused,
                    b.refused
                );
            }
        }
    }
    out
}

/// Text from traffic, for a terminal: control characters (an escape
/// sequence that would repaint the screen, a bare CR) shown escaped.
fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A CSV cell (RFC 4180): quoted when it holds a separator, a quote or a
/// line break (CR alone too); a cell a spreadsheet would take for a formula
/// (`=`, `+`, `-`, `@`, tab) gets a leading `'`.
fn csv(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text.to_owned()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// `series.json`: the same as `series.csv`, per scenario and rule.
pub(crate) fn series_json(outcomes: &[ScenarioResult]) -> serde_json::Value {
    let scenarios: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            serde_json::json!({
                "scenario": o.scenario,
                "bin_seconds": o.bin_seconds,
                "start": o.start,
                "rules": o.rules.iter().map(|r| serde_json::json!({
                    "rule": r.rule,
                    "requests": r.series.iter().map(|b| b.requests).collect::<Vec<_>>(),
                    "refused": r.series.iter().map(|b| b.refused).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({ "scenarios": scenarios })
}

/// One plot: requests, admitted and refused per second over time, and the
/// limit's rate for one client, as an SVG document.
pub(crate) fn plot(title: &str, rule: &RuleResult, bin_seconds: f64) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (560, 300)).into_drawing_area();
        let _ = draw(&root, title, rule, bin_seconds);
        let _ = root.present();
    }
    svg
}

fn draw(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    rule: &RuleResult,
    bin_seconds: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let per_second = |n: u64| n as f64 / bin_seconds;
    let x_end = (rule.series.len() as f64 * bin_seconds).max(bin_seconds);
    let y_top = rule
        .series
        .iter()
        .map(|b| per_second(b.requests))
        .fold(rule.limit_per_second, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_end, 0.0..y_top.max(1e-3))?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("requests/s")
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let points = |f: &dyn Fn(&Bin) -> u64| {
        rule.series
            .iter()
            .enumerate()
            .map(|(i, b)| (i as f64 * bin_seconds, per_second(f(b))))
            .collect::<Vec<_>>()
    };
    let blue = RGBColor(31, 119, 180);
    let green = RGBColor(44, 160, 44);
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(
            points(&|b| b.requests),
            blue.stroke_width(1),
        ))?
        .label("requests")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], blue));
    chart
        .draw_series(LineSeries::new(
            points(&|b| b.requests - b.refused),
            green.stroke_width(1),
        ))?
        .label("admitted")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], green));
    chart
        .draw_series(LineSeries::new(points(&|b| b.refused), red.stroke_width(1)))?
        .label("refused")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], red));
    let limit = rule.limit_per_second;
    chart
        .draw_series(LineSeries::new(
            [(0.0, limit), (x_end, limit)],
            BLACK.mix(0.5).stroke_width(1),
        ))?
        .label("limit per client")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.5)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 11))
        .draw()?;
    Ok(())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Every plot, per outcome and rule (in their order), titled with the
/// scenario and the limit.
fn plots(outcomes: &[ScenarioResult]) -> Vec<Vec<String>> {
    outcomes
        .iter()
        .map(|o| {
            o.rules
                .iter()
                .map(|r| plot(&format!("{} — {}", o.scenario, r.limit), r, o.bin_seconds))
                .collect()
        })
        .collect()
}

/// `report.html`: per rule, a row with its plot under each scenario, and the
/// summary table. Self-contained: no scripts, styles or fonts from elsewhere.
pub(crate) fn report_html(outcomes: &[ScenarioResult]) -> String {
    html_with(outcomes, &plots(outcomes))
}

/// `report.html` with the plots already drawn.
fn html_with(outcomes: &[ScenarioResult], plots: &[Vec<String>]) -> String {
    let mut html = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>tollgate simulate</title>\n<style>\nbody{font-family:sans-serif;margin:24px;color:#222}\n.row{display:flex;flex-wrap:wrap;gap:12px}\n.plot{border:1px solid #ddd}\ntable{border-collapse:collapse}td,th{border:1px solid #ddd;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}\n</style></head><body>\n<h1>tollgate simulate</h1>\n",
    );
    let _ = writeln!(
        html,
        "<h2>Summary</h2>\n<table><tr><th>scenario / rule</th><th>limit</th><th>requests</th><th>admitted</th><th>refused</th><th>tagged</th><th>peak</th></tr>"
    );
    for o in outcomes {
        let _ = writeln!(
            html,
            "<tr><th colspan=\"7\">{} ({} requests, {} refused)</th></tr>",
            escape(&o.scenario),
            o.requests,
            o.refused
        );
        for r in &o.rules {
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0} %</td></tr>",
                escape(&r.label()),
                escape(&r.limit),
                r.requests,
                r.admitted,
                r.refused,
                r.tagged,
                100.0 * r.peak_usage
            );
        }
    }
    html.push_str("</table>\n");
    // Rules in the order they first appear; each row shows every scenario.
    let mut rules: Vec<&str> = Vec::new();
    for o in outcomes {
        for r in &o.rules {
            if !rules.contains(&r.rule.as_str()) {
                rules.push(&r.rule);
            }
        }
    }
    for rule in rules {
        let _ = writeln!(
            html,
            "<h2 class=\"rule\">{}</h2>\n<div class=\"row\">",
            escape(rule)
        );
        for (o, svgs) in outcomes.iter().zip(plots) {
            if let Some(i) = o.rules.iter().position(|r| r.rule == rule) {
                let _ = writeln!(
                    html,
                    "<div class=\"plot\" data-rule=\"{}\">{}</div>",
                    escape(rule),
                    svgs[i]
                );
            }
        }
        html.push_str("</div>\n");
        refused_clients(&mut html, outcomes, rule);
    }
    html.push_str("</body></html>\n");
    html
}

/// The clients `rule` would refuse most, one column per scenario side by
/// side (a client another scenario spares shows `-`), heaviest first.
fn refused_clients(html: &mut String, outcomes: &[ScenarioResult], rule: &str) {
    let columns: Vec<Option<&RuleResult>> = outcomes
        .iter()
        .map(|o| o.rules.iter().find(|r| r.rule == rule))
        .collect();
    let mut clients: Vec<(&str, u64)> = Vec::new();
    for r in columns.iter().flatten() {
        for (client, n) in &r.top_refused {
            match clients.iter_mut().find(|(c, _)| c == client) {
                Some((_, most)) => *most = (*most).max(*n),
                None => clients.push((client, *n)),
            }
        }
    }
    if clients.is_empty() {
        return;
    }
    clients.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let _ = write!(
        html,
        "<table class=\"refused\"><tr><th>clients refused most</th>"
    );
    for o in outcomes {
        let _ = write!(html, "<th>{}</th>", escape(&o.scenario));
    }
    html.push_str("</tr>\n");
    for (client, _) in clients {
        let _ = write!(html, "<tr><td>{}</td>", escape(&printable(client)));
        for r in &columns {
            let n = r.and_then(|r| r.top_refused.iter().find(|(c, _)| c == client));
            match n {
                Some((_, n)) => {
                    let _ = write!(html, "<td>{n}</td>");
                }
                None => html.push_str("<td>-</td>"),
            }
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</table>\n");
}

/// Writes every output file into `dir`.
pub(crate) fn write_all(dir: &Path, outcomes: &[ScenarioResult]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let write = |name: &str, text: String| write_file(&dir.join(name), text.as_bytes());
    write(
        "summary.json",
        serde_json::to_string_pretty(&summary_json(outcomes)).unwrap_or_default(),
    )?;
    write("series.csv", series_csv(outcomes))?;
    write("series.json", series_json(outcomes).to_string())?;
    // Each plot is drawn once: in the report, and on its own for documents
    // (plots/<scenario>--<rule>.svg).
    let svgs = plots(outcomes);
    write("report.html", html_with(outcomes, &svgs))?;
    let dir = dir.join("plots");
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(format!(
            "{}: is a symbolic link; not writing through it",
            dir.display()
        ));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (o, svgs) in outcomes.iter().zip(svgs) {
        for (r, svg) in o.rules.iter().zip(svgs) {
            let path = dir.join(format!("{}--{}.svg", slug(&o.scenario), slug(&r.rule)));
            write_file(&path, svg.as_bytes())?;
        }
    }
    Ok(())
}

/// Writes `path`, never through a symbolic link a previous run (or anyone
/// else) left there: the link is refused by name.
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(format!(
            "{}: is a symbolic link; not writing through it (remove it, or choose another --out)",
            path.display()
        ));
    }
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// A file name part: letters, digits, `-` and `_`; anything else `_`.
pub(crate) fn slug(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_traffic_is_printable_and_csv_safe() {
        assert_eq!(printable("ann"), "ann");
        assert_eq!(printable("ann\u{1b}[2J\r"), "ann\\u{1b}[2J\\r");
        assert_eq!(csv("=HYPERLINK(1)"), "'=HYPERLINK(1)");
        assert_eq!(csv("@SUM"), "'@SUM");
        assert_eq!(csv("-1+2"), "'-1+2");
        assert_eq!(csv("a\rb"), "\"a\rb\"");
        assert_eq!(csv("a,b\"c"), "\"a,b\"\"c\"");
        assert_eq!(csv("api.user"), "api.user");
    }

    #[test]
    fn outputs_are_never_written_through_a_symbolic_link() {
        let dir = tempfile::tempdir().expect("dir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("write");
        let out = dir.path().join("out");
        std::fs::create_dir(&out).expect("dir");
        std::os::unix::fs::symlink(&victim, out.join("series.csv")).expect("link");
        let e = write_all(&out, &[]).expect_err("refused");
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
    }
}
