//! A minimal SVG writer for the `--plot` pictures: text, lines, scales with ticks, framed
//! panels, legends and colour maps.
//!
//! A key design decision: the SVG is written by hand rather than through a plotting crate,
//! so that every data mark can carry its values as `data-*` attributes and a `<title>`
//! (a tooltip in browsers). The tests read the numbers back from those attributes and
//! compare them with the JSON the same command prints; a plotting crate's backend writes
//! bare shapes with nothing to compare.

use std::fmt::Write as _;

/// Text with XML's special characters escaped, for element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Values as a data attribute holds them: space-separated, each in Rust's shortest form
/// that parses back to the same `f64`.
pub fn list(values: impl IntoIterator<Item = f64>) -> String {
    let mut out = String::new();
    for v in values {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{v}");
    }
    out
}

/// Ten distinct colours for categories (Tableau 10).
pub const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// The `i`-th category colour.
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// A colour for `t` in [0, 1] on the viridis map (dark blue, green, yellow).
pub fn viridis(t: f64) -> String {
    const STOPS: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let pos = t * (STOPS.len() - 1) as f64;
    let i = (pos.floor() as usize).min(STOPS.len() - 2);
    let f = pos - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(a.0, b.0),
        mix(a.1, b.1),
        mix(a.2, b.2)
    )
}

/// An SVG document being written.
#[derive(Debug)]
pub struct Svg {
    out: String,
}

impl Svg {
    /// A `width` x `height` picture on a white background, titled `title`.
    pub fn new(width: f64, height: f64, title: &str) -> Svg {
        let mut out = String::new();
        let _ = write!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
             viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <title>{}</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
            esc(title)
        );
        Svg { out }
    }

    /// Appends markup as it is (elements carrying data attributes are built by the charts).
    pub fn raw(&mut self, markup: &str) {
        self.out.push_str(markup);
        self.out.push('\n');
    }

    /// Text at (`x`, `y`); `anchor` is `start`, `middle` or `end`.
    pub fn text(&mut self, x: f64, y: f64, size: f64, anchor: &str, s: &str) {
        let _ = writeln!(
            self.out,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"{size}\" text-anchor=\"{anchor}\">{}</text>",
            esc(s)
        );
    }

    /// Text turned by `angle` degrees about its anchor point.
    pub fn text_rotated(&mut self, x: f64, y: f64, angle: f64, anchor: &str, s: &str) {
        let _ = writeln!(
            self.out,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\" \
             transform=\"rotate({angle} {x:.1} {y:.1})\">{}</text>",
            esc(s)
        );
    }

    /// A line; `dash` draws it dashed.
    pub fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: &str, dash: bool) {
        let dash = if dash {
            " stroke-dasharray=\"5 4\""
        } else {
            ""
        };
        let _ = writeln!(
            self.out,
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{stroke}\"{dash}/>"
        );
    }

    /// A rectangle without data (frames, legend keys).
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, stroke: &str) {
        let _ = writeln!(
            self.out,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{fill}\" stroke=\"{stroke}\"/>"
        );
    }

    /// A legend of coloured keys, one row each, starting at (`x`, `y`).
    pub fn legend(&mut self, x: f64, y: f64, items: &[(String, String)]) {
        for (i, (fill, label)) in items.iter().enumerate() {
            let yy = y + 16.0 * i as f64;
            self.rect(x, yy - 9.0, 12.0, 10.0, fill, "none");
            self.text(x + 16.0, yy, 11.0, "start", label);
        }
    }

    /// The finished document.
    pub fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

/// A map from data values to pixels along one axis, linear or logarithmic.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    from: f64,
    to: f64,
}

impl Scale {
    /// Values `lo ..= hi` onto pixels `from ..= to` (`to < from` for a y axis).
    pub fn linear(lo: f64, hi: f64, from: f64, to: f64) -> Scale {
        let hi = if hi > lo { hi } else { lo + 1.0 };
        Scale {
            lo,
            hi,
            log: false,
            from,
            to,
        }
    }

    /// A logarithmic scale over whole decades around `lo ..= hi` (both positive).
    pub fn log(lo: f64, hi: f64, from: f64, to: f64) -> Scale {
        let lo = 10f64.powf(lo.log10().floor());
        let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
        Scale {
            lo,
            hi,
            log: true,
            from,
            to,
        }
    }

    /// The pixel of `v` (values outside the range land outside the pixel range).
    pub fn px(&self, v: f64) -> f64 {
        let t = if self.log {
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        self.from + t * (self.to - self.from)
    }

    /// Tick values: each decade of a log scale, about five round steps of a linear one.
    pub fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (
                self.lo.log10().round() as i32,
                self.hi.log10().round() as i32,
            );
            return (a..=b).map(|e| 10f64.powi(e)).collect();
        }
        let raw = (self.hi - self.lo) / 5.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .into_iter()
            .map(|m| m * mag)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag);
        let first = (self.lo / step).ceil() as i64;
        let last = (self.hi / step + 1e-9).floor() as i64;
        (first..=last).map(|i| i as f64 * step).collect()
    }
}

/// A tick label: plain digits, no trailing zeros.
pub fn tick_label(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e6 || v.abs() < 1e-3) {
        return format!("{v:e}");
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A framed plotting area with its two scales.
#[derive(Debug, Clone, Copy)]
pub struct Panel {
    /// Left edge of the plotting area.
    pub x: f64,
    /// Top edge.
    pub y: f64,
    /// Width.
    pub w: f64,
    /// Height.
    pub h: f64,
}

impl Panel {
    /// A scale along this panel's x axis.
    pub fn xs(&self, lo: f64, hi: f64, log: bool) -> Scale {
        let (a, b) = (self.x, self.x + self.w);
        if log {
            Scale::log(lo, hi, a, b)
        } else {
            Scale::linear(lo, hi, a, b)
        }
    }

    /// A scale along this panel's y axis (upwards).
    pub fn ys(&self, lo: f64, hi: f64, log: bool) -> Scale {
        let (a, b) = (self.y + self.h, self.y);
        if log {
            Scale::log(lo, hi, a, b)
        } else {
            Scale::linear(lo, hi, a, b)
        }
    }

    /// The frame, grid lines at the ticks, tick labels, axis labels and a title.
    /// An axis without a scale (categories, lanes) gets no ticks.
    pub fn axes(&self, svg: &mut Svg, xs: Option<&Scale>, ys: Option<&Scale>, labels: [&str; 3]) {
        let [title, xlabel, ylabel] = labels;
        let (x0, x1, y0, y1) = (self.x, self.x + self.w, self.y, self.y + self.h);
        for t in xs.map(Scale::ticks).unwrap_or_default() {
            let px = xs.map_or(x0, |s| s.px(t));
            svg.line((px, y0), (px, y1), "#e4e4e4", false);
            svg.text(px, y1 + 14.0, 10.0, "middle", &tick_label(t));
        }
        for t in ys.map(Scale::ticks).unwrap_or_default() {
            let py = ys.map_or(y1, |s| s.px(t));
            svg.line((x0, py), (x1, py), "#e4e4e4", false);
            svg.text(x0 - 4.0, py + 3.5, 10.0, "end", &tick_label(t));
        }
        svg.rect(x0, y0, self.w, self.h, "none", "#444");
        svg.text((x0 + x1) / 2.0, y0 - 8.0, 13.0, "middle", title);
        svg.text((x0 + x1) / 2.0, y1 + 32.0, 11.0, "middle", xlabel);
        svg.text_rotated(x0 - 40.0, (y0 + y1) / 2.0, -90.0, "middle", ylabel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_map_ends_and_ticks_are_round() {
        let s = Scale::linear(0.0, 1.0, 100.0, 300.0);
        assert_eq!((s.px(0.0), s.px(1.0), s.px(0.5)), (100.0, 300.0, 200.0));
        assert_eq!(s.ticks(), vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]);
        let l = Scale::log(0.03, 420.0, 0.0, 400.0);
        assert_eq!(l.ticks(), vec![0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]);
        assert!((l.px(1.0) - 160.0).abs() < 1e-9);
        // An empty range does not divide by zero.
        assert!(Scale::linear(2.0, 2.0, 0.0, 10.0).px(2.0).is_finite());
    }

    #[test]
    fn text_and_lists_survive_a_round_trip() {
        assert_eq!(esc("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
        let v = [0.1 + 0.2, 1e-7, 12345.678];
        let back: Vec<f64> = list(v).split(' ').map(|s| s.parse().unwrap()).collect();
        assert_eq!(back, v);
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(1000.0), "1000");
        assert_eq!(viridis(0.0), "#440154");
        assert_eq!(viridis(1.0), "#fde725");
    }
}
