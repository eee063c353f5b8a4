//! The operator's page's charts: one rule's hits per second, admitted and refused, over
//! the last 15 minutes, rendered here as SVG. Owns the drawing only.
//!
//! Why server-rendered SVG rather than a vendored chart library (uPlot was the
//! candidate): the chart is two lines over 180 points with a scale, which is a few dozen
//! lines here, while a library is ~50 KB of minified third-party JavaScript to vendor,
//! audit and keep up to date under the page's Content-Security-Policy. An `<img>` of SVG
//! runs no script at all, needs no build step, and the page swaps it every refresh.

use std::fmt::Write as _;

use crate::service::top::RateReport;

const WIDTH: f64 = 360.0;
const HEIGHT: f64 = 96.0;
/// Room for the scale's text on the left and the time's below.
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 16.0;
/// Colours with at least 4.5:1 contrast on white (WCAG AA), told apart by dash too.
const ADMITTED: &str = "#1d5a9e";
const REFUSED: &str = "#b3261e";

/// Hits per second of each tick, `(admitted, refused)`; the last tick over the seconds
/// elapsed in it.
fn per_second(r: &RateReport) -> Vec<(f64, f64)> {
    let n = r.ticks.len();
    r.ticks
        .iter()
        .enumerate()
        .map(|(i, &(ok, over))| {
            let secs = if i + 1 == n {
                r.current_tick_seconds.max(1)
            } else {
                r.tick_seconds.max(1)
            } as f64;
            (ok as f64 / secs, over as f64 / secs)
        })
        .collect()
}

/// A scale top that reads well: 1, 2 or 5 times a power of ten, at least `max`.
fn nice(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|&v| v >= max)
        .unwrap_or(10.0 * p)
}

fn polyline(out: &mut String, points: &[f64], top: f64, colour: &str, dash: &str) {
    let step = (WIDTH - LEFT) / (points.len().max(2) - 1) as f64;
    let plot = HEIGHT - BOTTOM;
    let _ = write!(
        out,
        r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="{dash}" points=""#
    );
    for (i, v) in points.iter().enumerate() {
        let x = LEFT + i as f64 * step;
        let y = plot - (v / top).min(1.0) * (plot - 4.0);
        let _ = write!(out, "{x:.1},{y:.1} ");
    }
    out.push_str(r#""/>"#);
}

/// The chart of `r`, with a title that says in words what it shows.
pub fn chart_svg(r: &RateReport) -> String {
    let rates = per_second(r);
    let admitted: Vec<f64> = rates.iter().map(|p| p.0).collect();
    let refused: Vec<f64> = rates.iter().map(|p| p.1).collect();
    let top = nice(admitted.iter().chain(&refused).copied().fold(0.0, f64::max));
    let (now_ok, now_over) = rates.last().copied().unwrap_or_default();
    let plot = HEIGHT - BOTTOM;
    let mut out = String::with_capacity(8 * 1024);
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" font-family="sans-serif" font-size="10">"#
    );
    let _ = write!(
        out,
        "<title>{}: hits per second over the last 15 minutes; now {now_ok:.1} admitted, {now_over:.1} refused; scale top {top}</title>",
        escape(&r.rule)
    );
    let _ = write!(
        out,
        r##"<rect x="{LEFT}" y="0" width="{w}" height="{plot}" fill="#ffffff" stroke="#6b6b6b"/>"##,
        w = WIDTH - LEFT
    );
    let _ = write!(
        out,
        r##"<text x="{x}" y="10" text-anchor="end" fill="#222">{top}/s</text><text x="{x}" y="{plot}" text-anchor="end" fill="#222">0</text>"##,
        x = LEFT - 4.0
    );
    let _ = write!(
        out,
        r##"<text x="{LEFT}" y="{HEIGHT}" fill="#222" dy="-3">15 min ago</text><text x="{WIDTH}" y="{HEIGHT}" text-anchor="end" fill="#222" dy="-3">now</text>"##
    );
    polyline(&mut out, &admitted, top, ADMITTED, "none");
    polyline(&mut out, &refused, top, REFUSED, "4 2");
    out.push_str("</svg>");
    out
}

/// Text made safe inside SVG markup (a stats key carries request values for some rules).
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_scales_to_its_peak_and_escapes_its_title() {
        let mut ticks = vec![(0, 0); 180];
        ticks[100] = (35, 5);
        ticks[179] = (4, 2);
        let r = RateReport {
            domain: "d".into(),
            rule: "d.k_<x>".into(),
            tick_seconds: 5,
            current_tick_seconds: 2,
            ticks,
        };
        let svg = chart_svg(&r);
        // 35 hits in 5 s: 7/s, under a scale top of 10; now 4 in 2 s.
        assert!(svg.contains(">10/s<"), "{svg}");
        assert!(svg.contains("now 2.0 admitted, 1.0 refused"), "{svg}");
        assert!(
            svg.contains("d.k_&lt;x&gt;") && !svg.contains("<x>"),
            "{svg}"
        );
        assert_eq!(nice(0.3), 0.5);
        assert_eq!(nice(120.0), 200.0);
    }
}
