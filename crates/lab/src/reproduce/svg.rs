//! Small, dependency-free SVG charts for the reproduction report: line charts of
//! (x, y) series and grouped or stacked bar charts. Output is plain SVG text meant to be
//! inlined in an HTML page.

use std::fmt::Write;

const W: f64 = 560.0;
const H: f64 = 340.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 72.0;

/// Colours for series, in order (distinguishable in print and for most colour vision).
const COLOURS: [&str; 8] =
    ["#1b6ca8", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#a6761d", "#666666"];

fn colour(i: usize) -> &'static str {
    COLOURS[i % COLOURS.len()]
}

pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A "nice" step for about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f < 1.5 {
        1.0
    } else if f < 3.0 {
        2.0
    } else if f < 7.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// Tick values from 0 (or below `lo`) to at least `hi`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let step = nice_step(hi - lo, 5.0);
    let start = (lo / step).floor() * step;
    let mut v = Vec::new();
    let mut t = start;
    while t <= hi + step * 0.5 && v.len() < 20 {
        v.push(t);
        t += step;
    }
    v
}

fn label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}").trim_end_matches(".0").to_string()
    } else {
        format!("{v:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

struct Frame {
    svg: String,
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    fn new(
        title: &str,
        x_label: &str,
        y_label: &str,
        x: (f64, f64),
        y: (f64, f64),
        x_ticks: bool,
    ) -> Frame {
        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">"#
        );
        let _ = write!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = write!(
            svg,
            r#"<text x="{}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{}</text>"#,
            W / 2.0,
            esc(title)
        );
        let f = Frame { svg, x0: x.0, x1: x.1, y0: y.0, y1: y.1 };
        let mut f = f;
        let (px0, py0) = (LEFT, H - BOTTOM);
        let (px1, py1) = (W - RIGHT, TOP);
        for t in ticks(y.0, y.1) {
            let py = f.py(t);
            if py < py1 - 1.0 || py > py0 + 1.0 {
                continue;
            }
            let _ = write!(
                f.svg,
                r##"<line x1="{px0}" y1="{py}" x2="{px1}" y2="{py}" stroke="#e4e4e4"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                px0 - 5.0,
                py + 4.0,
                label(t)
            );
        }
        if x_ticks {
            for t in ticks(x.0, x.1) {
                let px = f.px(t);
                if px < px0 - 1.0 || px > px1 + 1.0 {
                    continue;
                }
                let _ = write!(
                    f.svg,
                    r##"<line x1="{px}" y1="{py0}" x2="{px}" y2="{}" stroke="#999"/><text x="{px}" y="{}" text-anchor="middle">{}</text>"##,
                    py0 + 4.0,
                    py0 + 16.0,
                    label(t)
                );
            }
        }
        let _ = write!(
            f.svg,
            r##"<line x1="{px0}" y1="{py0}" x2="{px1}" y2="{py0}" stroke="#333"/><line x1="{px0}" y1="{py0}" x2="{px0}" y2="{py1}" stroke="#333"/>"##
        );
        let _ = write!(
            f.svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (px0 + px1) / 2.0,
            py0 + 32.0,
            esc(x_label)
        );
        let _ = write!(
            f.svg,
            r#"<text x="14" y="{}" text-anchor="middle" transform="rotate(-90 14 {})">{}</text>"#,
            (py0 + py1) / 2.0,
            (py0 + py1) / 2.0,
            esc(y_label)
        );
        f
    }

    fn px(&self, x: f64) -> f64 {
        let span = (self.x1 - self.x0).max(1e-12);
        LEFT + (x - self.x0) / span * (W - LEFT - RIGHT)
    }

    fn py(&self, y: f64) -> f64 {
        let span = (self.y1 - self.y0).max(1e-12);
        (H - BOTTOM) - (y - self.y0) / span * (H - BOTTOM - TOP)
    }

    fn legend(&mut self, labels: &[&str]) {
        let y = H - 18.0;
        let mut x = LEFT;
        for (i, l) in labels.iter().enumerate() {
            let _ = write!(
                self.svg,
                r#"<rect x="{x}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
                y - 9.0,
                colour(i),
                x + 14.0,
                y,
                esc(l)
            );
            x += 22.0 + 6.5 * l.len() as f64;
        }
    }

    fn finish(mut self) -> String {
        self.svg.push_str("</svg>");
        self.svg
    }
}

/// Bounds of the values with some headroom; the low end is 0 unless values go below.
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (0.0f64, 0.0f64);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi <= lo {
        hi = lo + 1.0;
    }
    (lo, hi * 1.08)
}

/// How a chart's x axis maps values.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum XAxis {
    /// Evenly spaced values.
    Linear,
    /// Base-2 logarithmic, a tick per power of two (payload sizes from 8 B to 64 KiB).
    Log2,
}

/// What a line chart draws besides its series.
#[derive(Default)]
pub struct Marks<'a> {
    /// A label per point of each series (the coroutine count of a throughput/latency
    /// point), in the series' order; empty: none.
    pub point_labels: &'a [Vec<String>],
    /// The paper's own values, drawn as hollow diamonds: (label, x, y).
    pub paper: &'a [(String, f64, f64)],
}

/// A line chart: each series a list of (x, y) points joined in order, with markers, on
/// the given x axis, with labelled points and the paper's values.
pub fn lines_marked(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    x_axis: XAxis,
    marks: &Marks<'_>,
) -> String {
    let mut f = plot(title, x_label, y_label, series, x_axis, true, marks.paper);
    let tx = |x: f64| match x_axis {
        XAxis::Linear => x,
        XAxis::Log2 => x.max(1.0).log2(),
    };
    for (i, ((_, pts), labels)) in series.iter().zip(marks.point_labels).enumerate() {
        for (&(x, y), l) in pts.iter().zip(labels) {
            let _ = write!(
                f.svg,
                r#"<text x="{:.1}" y="{:.1}" font-size="9" fill="{}">{}</text>"#,
                f.px(tx(x)) + 4.0,
                f.py(y) - 4.0,
                colour(i),
                esc(l)
            );
        }
    }
    for (l, x, y) in marks.paper {
        let (px, py) = (f.px(tx(*x)), f.py(*y));
        let text = format!("paper: {l}");
        // Right of the diamond, or left of it where the label would leave the frame.
        let (tx_, anchor) = if px + 7.0 + 5.5 * text.len() as f64 > W {
            (px - 7.0, "end")
        } else {
            (px + 7.0, "start")
        };
        let _ = write!(
            f.svg,
            r##"<path d="M{px:.1},{:.1} L{:.1},{py:.1} L{px:.1},{:.1} L{:.1},{py:.1} Z" fill="none" stroke="#000" stroke-width="1.5"/><text x="{tx_:.1}" y="{:.1}" font-size="9" text-anchor="{anchor}">{}</text>"##,
            py - 5.0,
            px + 5.0,
            py + 5.0,
            px - 5.0,
            py + 3.0,
            esc(&text)
        );
    }
    f.finish()
}

/// A series over time: lines without markers (one point per interval), and a dashed
/// vertical line at `event_x` labelled `event`.
pub fn timeline(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    event_x: f64,
    event: &str,
) -> String {
    let mut f = plot(title, x_label, y_label, series, XAxis::Linear, false, &[]);
    let px = f.px(event_x);
    let _ = write!(
        f.svg,
        r##"<line x1="{px:.1}" y1="{}" x2="{px:.1}" y2="{}" stroke="#555" stroke-dasharray="4 3"/><text x="{:.1}" y="{}">{}</text>"##,
        TOP,
        H - BOTTOM,
        px + 4.0,
        TOP + 12.0,
        esc(event)
    );
    f.finish()
}

/// The frame and lines of a line chart, before it is finished; its bounds also hold
/// `paper`'s points.
fn plot(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    x_axis: XAxis,
    markers: bool,
    paper: &[(String, f64, f64)],
) -> Frame {
    let log_x = x_axis == XAxis::Log2;
    let tx = |x: f64| if log_x { x.max(1.0).log2() } else { x };
    let series: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(l, pts)| (l.clone(), pts.iter().map(|&(x, y)| (tx(x), y)).collect()))
        .collect();
    let xs =
        || series.iter().flat_map(|s| s.1.iter().map(|p| p.0)).chain(paper.iter().map(|p| tx(p.1)));
    let x = if log_x {
        let (lo, hi) = xs().fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
        (lo.floor().min(hi), hi.ceil().max(lo + 1.0))
    } else {
        bounds(xs())
    };
    let y = bounds(
        series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).chain(paper.iter().map(|p| p.2)),
    );
    let mut f = Frame::new(title, x_label, y_label, x, y, !log_x);
    if log_x {
        // One tick per power of two.
        let py0 = H - BOTTOM;
        let mut e = x.0;
        while e <= x.1 + 1e-9 {
            let px = f.px(e);
            let _ = write!(
                f.svg,
                r##"<line x1="{px}" y1="{py0}" x2="{px}" y2="{}" stroke="#999"/><text x="{px}" y="{}" text-anchor="middle">{}</text>"##,
                py0 + 4.0,
                py0 + 16.0,
                2f64.powf(e).round()
            );
            e += 1.0;
        }
    }
    for (i, (_, pts)) in series.iter().enumerate() {
        let path: Vec<String> =
            pts.iter().map(|&(a, b)| format!("{:.1},{:.1}", f.px(a), f.py(b))).collect();
        let _ = write!(
            f.svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
            path.join(" "),
            colour(i)
        );
        for &(a, b) in pts.iter().filter(|_| markers) {
            let _ = write!(
                f.svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                f.px(a),
                f.py(b),
                colour(i)
            );
        }
    }
    let labels: Vec<&str> = series.iter().map(|s| s.0.as_str()).collect();
    f.legend(&labels);
    f
}

/// Grouped bars: one group per entry of `groups`, one bar per series in each.
pub fn bars(
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[(String, Vec<f64>)],
) -> String {
    let y = bounds(series.iter().flat_map(|s| s.1.iter().copied()));
    let mut f = Frame::new(title, "", y_label, (0.0, groups.len() as f64), y, false);
    let slot = (W - LEFT - RIGHT) / groups.len().max(1) as f64;
    let bar = (slot * 0.8) / series.len().max(1) as f64;
    for (g, name) in groups.iter().enumerate() {
        let gx = LEFT + g as f64 * slot;
        for (i, (_, vals)) in series.iter().enumerate() {
            let v = vals.get(g).copied().unwrap_or(0.0);
            if !v.is_finite() {
                continue;
            }
            let (top, base) = (f.py(v.max(0.0)), f.py(0.0));
            let _ = write!(
                f.svg,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                gx + slot * 0.1 + i as f64 * bar,
                top,
                bar * 0.92,
                (base - top).max(0.0),
                colour(i),
                label(v)
            );
        }
        let _ = write!(
            f.svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            gx + slot / 2.0,
            H - BOTTOM + 16.0,
            esc(name)
        );
    }
    let labels: Vec<&str> = series.iter().map(|s| s.0.as_str()).collect();
    f.legend(&labels);
    f.finish()
}

/// Stacked bars: one bar per group, `parts` stacked in order.
pub fn stacked(
    title: &str,
    y_label: &str,
    groups: &[String],
    parts: &[(String, Vec<f64>)],
) -> String {
    let totals: Vec<f64> = (0..groups.len())
        .map(|g| parts.iter().map(|p| p.1.get(g).copied().unwrap_or(0.0)).sum())
        .collect();
    let y = bounds(totals.iter().copied());
    let mut f = Frame::new(title, "", y_label, (0.0, groups.len() as f64), y, false);
    let slot = (W - LEFT - RIGHT) / groups.len().max(1) as f64;
    for (g, name) in groups.iter().enumerate() {
        let mut acc = 0.0;
        for (i, (_, vals)) in parts.iter().enumerate() {
            let v = vals.get(g).copied().unwrap_or(0.0).max(0.0);
            let (top, base) = (f.py(acc + v), f.py(acc));
            let _ = write!(
                f.svg,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                LEFT + g as f64 * slot + slot * 0.2,
                top,
                slot * 0.6,
                (base - top).max(0.0),
                colour(i),
                label(v)
            );
            acc += v;
        }
        let _ = write!(
            f.svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + g as f64 * slot + slot / 2.0,
            H - BOTTOM + 16.0,
            esc(name)
        );
    }
    let labels: Vec<&str> = parts.iter().map(|s| s.0.as_str()).collect();
    f.legend(&labels);
    f.finish()
}

/// A grid of cells (rows by columns), each coloured by which contender has the largest
/// value there and labelled with it and its margin over the runner-up (`rates[row][col]`
/// holds one value per contender); `mark` outlines one cell.
pub fn winners(
    title: &str,
    rows: &[String],
    cols: &[String],
    contenders: &[String],
    rates: &[Vec<Vec<f64>>],
    mark: Option<(usize, usize)>,
) -> String {
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11"><rect width="{W}" height="{H}" fill="white"/><text x="{}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    let cw = (W - LEFT - RIGHT) / cols.len().max(1) as f64;
    let ch = (H - TOP - BOTTOM) / rows.len().max(1) as f64;
    for (r, name) in rows.iter().enumerate() {
        let y = TOP + r as f64 * ch;
        let _ = write!(
            svg,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + ch / 2.0 + 4.0,
            esc(name)
        );
        for c in 0..cols.len() {
            let x = LEFT + c as f64 * cw;
            let vals = rates.get(r).and_then(|row| row.get(c)).map_or(&[][..], Vec::as_slice);
            let mut order: Vec<usize> = (0..vals.len()).collect();
            order.sort_by(|&a, &b| vals[b].total_cmp(&vals[a]));
            let (fill, text) = match (order.first(), order.get(1)) {
                (Some(&w), Some(&second)) if vals[w] > 0.0 => {
                    let margin =
                        if vals[second] > 0.0 { vals[w] / vals[second] } else { f64::INFINITY };
                    (
                        colour(w),
                        format!("{} x{margin:.2}", contenders.get(w).map_or("?", String::as_str)),
                    )
                }
                _ => ("#dddddd", "too few commits".to_string()),
            };
            let _ = write!(
                svg,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{fill}" fill-opacity="0.75" stroke="white"/><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#111">{}</text>"##,
                cw,
                ch,
                x + cw / 2.0,
                y + ch / 2.0 + 4.0,
                esc(&text)
            );
            if mark == Some((r, c)) {
                let _ = write!(
                    svg,
                    r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#111" stroke-width="3"/>"##,
                    x + 1.5,
                    y + 1.5,
                    cw - 3.0,
                    ch - 3.0
                );
            }
        }
    }
    for (c, name) in cols.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + c as f64 * cw + cw / 2.0,
            H - BOTTOM + 16.0,
            esc(name)
        );
    }
    let (mut x, y) = (LEFT, H - 18.0);
    for (i, l) in contenders.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<rect x="{x}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{y}">{}</text>"#,
            y - 9.0,
            colour(i),
            x + 14.0,
            esc(l)
        );
        x += 22.0 + 6.5 * l.len() as f64;
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg() {
        let series = [("a".into(), vec![(1.0, 2.0), (2.0, 3.5)])];
        let l = lines_marked("t<1>", "x", "y", &series, XAxis::Linear, &Marks::default());
        assert!(l.starts_with("<svg") && l.ends_with("</svg>"));
        assert!(l.contains("t&lt;1&gt;"), "titles are escaped");
        assert!(l.contains("<polyline"));
        let b = bars("b", "y", &["g1".into(), "g2".into()], &[("s".into(), vec![1.0, f64::NAN])]);
        assert_eq!(b.matches("<rect x=").count(), 2, "one bar (NaN skipped) and one legend key");
        let s =
            stacked("s", "y", &["g".into()], &[("p1".into(), vec![1.0]), ("p2".into(), vec![2.0])]);
        assert!(s.contains("</svg>"));
    }

    #[test]
    fn a_payload_sweep_has_a_log_axis_labelled_points_and_the_papers_values() {
        let series = [("read".to_string(), vec![(8.0, 1.0), (64.0, 2.0), (4096.0, 3.0)])];
        let labels = [vec!["a".to_string(), "b".to_string(), "c".to_string()]];
        let paper = [("read".to_string(), 64.0, 86.9)];
        let marks = Marks { point_labels: &labels, paper: &paper };
        let svg = lines_marked("t", "payload", "rate", &series, XAxis::Log2, &marks);
        // A tick per power of two from 8 to 4096: 10 of them, 64 among them.
        for tick in [8, 16, 64, 1024, 4096] {
            assert!(svg.contains(&format!(">{tick}</text>")), "tick {tick}: {svg}");
        }
        assert!(!svg.contains(">8192<"), "no tick past the data: {svg}");
        // 64 sits a third of the way from 8 to 4096 on a log scale (3 of 9 doublings).
        let f = plot("t", "x", "y", &series, XAxis::Log2, true, &paper);
        let (x8, x64, x4096) = (f.px(3.0), f.px(6.0), f.px(12.0));
        assert!(((x64 - x8) / (x4096 - x8) - 1.0 / 3.0).abs() < 1e-9);
        for l in ["a", "b", "c"] {
            assert!(svg.contains(&format!(">{l}</text>")), "point label {l}");
        }
        assert!(svg.contains("paper: read") && svg.contains("<path d=\"M"), "the paper's diamond");
        // The paper's value is inside the frame: the y axis reaches 86.9.
        assert!(f.y1 >= 86.9, "{}", f.y1);
    }

    #[test]
    fn ticks_cover_the_range() {
        let t = ticks(0.0, 87.0);
        assert_eq!(t.first(), Some(&0.0));
        let step = t[1] - t[0];
        // The last tick is within one step of the top, never beyond it by more.
        assert!(*t.last().unwrap() > 87.0 - step && *t.last().unwrap() <= 87.0 + step, "{t:?}");
    }

    #[test]
    fn winners_name_each_cells_fastest_and_its_margin() {
        let names = vec!["a".to_string(), "b".to_string()];
        let svg = winners(
            "t<1>",
            &["r0".to_string()],
            &["c0".to_string(), "c1".to_string()],
            &names,
            &[vec![vec![2.0, 1.0], vec![1.0, 4.0]]],
            Some((0, 1)),
        );
        assert!(svg.contains("a x2.00") && svg.contains("b x4.00"), "{svg}");
        assert!(svg.contains("t&lt;1&gt;"));
        assert_eq!(svg.matches("stroke-width=\"3\"").count(), 1, "one cell marked");
        let empty = winners("t", &["r".into()], &["c".into()], &names, &[vec![vec![]]], None);
        assert!(empty.contains("too few commits"));
    }
}
