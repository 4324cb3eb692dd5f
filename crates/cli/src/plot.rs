//! The pictures behind `--plot FILE.svg`: expert load of a routing trace (`strata trace`),
//! the MoE kernels' roofline (`strata bench moe`), a reproduction beside the paper's
//! figures and the simulated timeline as a Gantt chart (`strata simulate`).
//!
//! Every data mark carries the numbers it draws as `data-*` attributes (the same `f64`s the
//! command prints as JSON, in their shortest exact form) and a `<title>` tooltip:
//! `class="cell"` heat map cells, `class="series"` polylines (`data-series`, `data-x`,
//! `data-y` lists), `class="ceiling"` peak lines, `class="bar"` reproduction bars and
//! `class="op"` timeline operations. The tests read them back; so can anyone's script.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde_json::Value;
use strata_sim::reproduce::Reproduction;
use strata_sim::{Lane, Report};

use crate::svg::{Panel, Scale, Svg, color, esc, list, viridis};
use strata_sim::reproduce::{TOLERANCE, agreement};

/// Writes a picture to `path`.
pub fn write(path: &Path, svg: String) -> anyhow::Result<()> {
    std::fs::write(path, svg).with_context(|| format!("writing the plot {}", path.display()))
}

/// Each layer's experts, busiest first (ties by lower id), with their share of the layer's
/// routed (token, expert) activations.
pub fn ranked_shares(counts: &[Vec<u64>]) -> Vec<Vec<(usize, f64)>> {
    counts
        .iter()
        .map(|layer| {
            let total = layer.iter().sum::<u64>().max(1) as f64;
            let mut ranked: Vec<(usize, f64)> = layer
                .iter()
                .enumerate()
                .map(|(e, &c)| (e, c as f64 / total))
                .collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            ranked
        })
        .collect()
}

/// `strata trace --plot`: a heat map of each MoE layer's experts sorted by load, and the
/// cumulative share of tokens the busiest experts take, one curve per layer.
pub fn expert_load(counts: &[Vec<u64>], model: &str) -> String {
    let ranked = ranked_shares(counts);
    let layers = ranked.len();
    let experts = ranked.first().map_or(0, Vec::len);
    let heat = Panel {
        x: 70.0,
        y: 60.0,
        w: 520.0,
        h: (layers as f64 * 22.0).clamp(200.0, 640.0),
    };
    let curve = Panel {
        x: 720.0,
        y: heat.y,
        w: 300.0,
        h: heat.h.min(300.0),
    };
    let height = heat.y + heat.h + 70.0;
    let mut svg = Svg::new(1060.0, height, &format!("expert load of {model}"));
    svg.text(
        20.0,
        24.0,
        15.0,
        "start",
        &format!(
            "Expert load of {model}: {layers} MoE layers, {experts} experts{}",
            top_fifth_summary(&ranked)
        ),
    );
    heat_map(&mut svg, &heat, &ranked);
    cumulative(&mut svg, &curve, &ranked);
    svg.finish()
}

/// ", the busiest 20% take 41% of tokens (mean over layers)", or nothing without experts.
fn top_fifth_summary(ranked: &[Vec<(usize, f64)>]) -> String {
    let experts = ranked.first().map_or(0, Vec::len);
    if experts == 0 {
        return String::new();
    }
    let top = (experts as f64 * 0.2).ceil() as usize;
    let mean = ranked
        .iter()
        .map(|l| l[..top].iter().map(|x| x.1).sum::<f64>())
        .sum::<f64>()
        / ranked.len() as f64;
    format!(
        "; the busiest 20% take {:.0}% of tokens (mean over layers)",
        mean * 100.0
    )
}

fn heat_map(svg: &mut Svg, p: &Panel, ranked: &[Vec<(usize, f64)>]) {
    let layers = ranked.len().max(1);
    let experts = ranked.first().map_or(0, Vec::len).max(1);
    let max = ranked
        .iter()
        .flatten()
        .map(|x| x.1)
        .fold(0.0f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let (cw, ch) = (p.w / experts as f64, p.h / layers as f64);
    for (l, layer) in ranked.iter().enumerate() {
        for (r, &(e, share)) in layer.iter().enumerate() {
            svg.raw(&format!(
                "<rect class=\"cell\" x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{:.2}\" \
                 fill=\"{}\" data-layer=\"{l}\" data-rank=\"{r}\" data-expert=\"{e}\" \
                 data-share=\"{share}\"><title>layer {l}, expert {e} (rank {}): {:.2}% of \
                 tokens</title></rect>",
                p.x + r as f64 * cw,
                p.y + l as f64 * ch,
                cw,
                ch,
                viridis(share / max),
                r + 1,
                share * 100.0
            ));
        }
    }
    svg.rect(p.x, p.y, p.w, p.h, "none", "#444");
    let every = layers.div_ceil(24);
    for l in (0..layers).step_by(every) {
        let y = p.y + (l as f64 + 0.5) * ch + 4.0;
        svg.text(p.x - 6.0, y, 10.0, "end", &l.to_string());
    }
    let ticks = [1, experts / 4, experts / 2, 3 * experts / 4, experts];
    for r in ticks.into_iter().filter(|&r| r >= 1) {
        let x = p.x + (r as f64 - 0.5) * cw;
        svg.text(x, p.y + p.h + 14.0, 10.0, "middle", &r.to_string());
    }
    svg.text(
        p.x + p.w / 2.0,
        p.y - 10.0,
        13.0,
        "middle",
        "Share of each layer's tokens, experts sorted by load",
    );
    svg.text(
        p.x + p.w / 2.0,
        p.y + p.h + 32.0,
        11.0,
        "middle",
        "expert rank (1 = busiest)",
    );
    svg.text_rotated(p.x - 36.0, p.y + p.h / 2.0, -90.0, "middle", "MoE layer");
    // Colour bar.
    let (bx, steps) = (p.x + p.w + 14.0, 40);
    for i in 0..steps {
        let t = 1.0 - i as f64 / steps as f64;
        let y = p.y + p.h * i as f64 / steps as f64;
        svg.rect(bx, y, 12.0, p.h / steps as f64 + 0.5, &viridis(t), "none");
    }
    svg.text(
        bx + 16.0,
        p.y + 9.0,
        10.0,
        "start",
        &format!("{:.1}%", max * 100.0),
    );
    svg.text(bx + 16.0, p.y + p.h, 10.0, "start", "0%");
}

fn cumulative(svg: &mut Svg, p: &Panel, ranked: &[Vec<(usize, f64)>]) {
    let (xs, ys) = (p.xs(0.0, 100.0, false), p.ys(0.0, 100.0, false));
    p.axes(
        svg,
        Some(&xs),
        Some(&ys),
        [
            "Top x% of experts take y% of tokens",
            "busiest experts (%)",
            "tokens (%)",
        ],
    );
    svg.line(
        (xs.px(0.0), ys.px(0.0)),
        (xs.px(100.0), ys.px(100.0)),
        "#999",
        true,
    );
    let last = ranked.len().saturating_sub(1).max(1) as f64;
    for (l, layer) in ranked.iter().enumerate() {
        let n = layer.len() as f64;
        let x: Vec<f64> = (1..=layer.len()).map(|r| r as f64 / n).collect();
        let y: Vec<f64> = layer
            .iter()
            .scan(0.0, |acc, s| {
                *acc += s.1;
                Some(*acc)
            })
            .collect();
        let mut points = format!("{:.1},{:.1}", xs.px(0.0), ys.px(0.0));
        for (a, b) in x.iter().zip(&y) {
            let _ = write!(points, " {:.1},{:.1}", xs.px(a * 100.0), ys.px(b * 100.0));
        }
        svg.raw(&format!(
            "<polyline class=\"series\" data-series=\"layer {l}\" data-x=\"{}\" data-y=\"{}\" \
             points=\"{points}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"><title>layer \
             {l}</title></polyline>",
            list(x),
            list(y),
            viridis(l as f64 / last),
        ));
    }
    let mut keys = vec![(viridis(0.0), "layer 0".to_string())];
    if ranked.len() > 1 {
        keys.push((viridis(1.0), format!("layer {}", ranked.len() - 1)));
    }
    keys.push(("#999".into(), "uniform routing".into()));
    svg.legend(p.x + p.w - 110.0, p.y + p.h - 44.0, &keys);
}

/// The compute peaks `bench moe` measures, as (JSON key, label).
const COMPUTE_PEAKS: [(&str, &str); 8] = [
    ("amx_bf16_tflops", "AMX BF16"),
    ("amx_int8_tops", "AMX INT8"),
    ("avx512_bf16_tflops", "AVX-512 BF16"),
    ("avx512_fma_tflops", "AVX-512 FMA"),
    ("avx512_vnni_tops", "AVX-512 VNNI"),
    ("avx_vnni_tops", "AVX-VNNI"),
    ("avx2_int8_tops", "AVX2 INT8"),
    ("avx2_fma_tflops", "AVX2 FMA"),
];

/// `strata bench moe --plot`: achieved TFLOPS and weight GB/s against tokens per expert,
/// one series per format, with the measured peaks drawn as ceilings.
pub fn roofline(doc: &Value) -> String {
    let mut series: Vec<(String, Vec<[f64; 3]>)> = Vec::new();
    for r in doc["results"].as_array().into_iter().flatten() {
        let name = r["format"].as_str().unwrap_or("?").to_string();
        let num = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let point = [num("tokens_per_expert"), num("tflops"), num("weight_gbs")];
        match series.iter_mut().find(|s| s.0 == name) {
            Some(s) => s.1.push(point),
            None => series.push((name, vec![point])),
        }
    }
    let peaks = &doc["peaks"];
    let compute: Vec<(&str, &str, f64)> = COMPUTE_PEAKS
        .iter()
        .filter_map(|&(k, label)| peaks[k].as_f64().map(|v| (k, label, v)))
        .collect();
    let read: Vec<(&str, &str, f64)> = peaks["read_gbs"]
        .as_f64()
        .map(|v| ("read_gbs", "DRAM read", v))
        .into_iter()
        .collect();
    let shape = &doc["shape"];
    let title = format!(
        "MoE layer on the CPU kernels: hidden {} inter {} experts {} top-{}, {} threads, {}",
        shape["hidden"],
        shape["inter"],
        shape["experts"],
        shape["topk"],
        doc["machine"]["threads"],
        doc["machine"]["selected_isa"].as_str().unwrap_or("?"),
    );
    let mut svg = Svg::new(1060.0, 470.0, &title);
    svg.text(20.0, 24.0, 15.0, "start", &title);
    let left = Panel {
        x: 80.0,
        y: 70.0,
        w: 400.0,
        h: 320.0,
    };
    let right = Panel { x: 600.0, ..left };
    let panels = [
        (left, 1, &compute, "Compute", "TFLOPS (TOPS for int)"),
        (
            right,
            2,
            &read,
            "Weight bandwidth",
            "expert weights read (GB/s)",
        ),
    ];
    // The JSON key each panel's y values come from, by column of a point.
    let quantity = ["tokens_per_expert", "tflops", "weight_gbs"];
    let xs_all: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p[0]))
        .collect();
    for (p, col, ceilings, name, ylabel) in panels {
        let ys_all = series
            .iter()
            .flat_map(|s| s.1.iter().map(|pt| pt[col]))
            .chain(ceilings.iter().map(|c| c.2));
        let (ylo, yhi) = positive_range(ys_all);
        let (xlo, xhi) = positive_range(xs_all.iter().copied());
        let (xs, ys) = (p.xs(xlo, xhi, true), p.ys(ylo, yhi, true));
        p.axes(
            &mut svg,
            Some(&xs),
            Some(&ys),
            [name, "tokens per expert", ylabel],
        );
        for (k, label, v) in ceilings.iter() {
            let y = ys.px(*v);
            svg.raw(&format!(
                "<line class=\"ceiling\" data-name=\"{k}\" data-value=\"{v}\" x1=\"{:.1}\" \
                 y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#c00\" \
                 stroke-dasharray=\"6 3\"><title>{label} peak: {v:.3}</title></line>",
                p.x,
                p.x + p.w
            ));
            svg.text(
                p.x + p.w - 4.0,
                y - 4.0,
                10.0,
                "end",
                &format!("{label} peak {v:.2}"),
            );
        }
        for (i, (fmt, pts)) in series.iter().enumerate() {
            series_line(
                &mut svg,
                (&xs, &ys),
                (fmt, quantity[col]),
                pts,
                col,
                color(i),
            );
        }
    }
    let keys: Vec<(String, String)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (color(i).to_string(), s.0.clone()))
        .collect();
    svg.legend(
        left.x + 10.0,
        left.y + left.h - 16.0 * keys.len() as f64,
        &keys,
    );
    svg.text(
        20.0,
        455.0,
        10.0,
        "start",
        "Dashed: the machine's peaks measured in the same run. Points below the ceilings show \
         how far each format is from its limit.",
    );
    svg.finish()
}

/// The smallest and largest positive finite values (a log scale's range), `(1, 10)` for none.
fn positive_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if hi > 0.0 { (lo, hi) } else { (1.0, 10.0) }
}

/// One format's points (`pt[0]` against `pt[col]`, the JSON's `quantity`) as a line with
/// markers; values a log scale cannot show are left out of the drawing but kept in the data.
fn series_line(
    svg: &mut Svg,
    (xs, ys): (&Scale, &Scale),
    (name, quantity): (&str, &str),
    pts: &[[f64; 3]],
    col: usize,
    stroke: &str,
) {
    let shown: Vec<(f64, f64)> = pts
        .iter()
        .filter(|p| p[0] > 0.0 && p[col] > 0.0 && p[col].is_finite())
        .map(|p| (xs.px(p[0]), ys.px(p[col])))
        .collect();
    let points: Vec<String> = shown
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    svg.raw(&format!(
        "<polyline class=\"series\" data-series=\"{}\" data-quantity=\"{quantity}\" \
         data-x=\"{}\" data-y=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{stroke}\" \
         stroke-width=\"2\"><title>{}</title></polyline>",
        esc(name),
        list(pts.iter().map(|p| p[0])),
        list(pts.iter().map(|p| p[col])),
        points.join(" "),
        esc(name),
    ));
    for (x, y) in shown {
        svg.raw(&format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{stroke}\"/>"
        ));
    }
}

/// `strata simulate --reproduce NAME --plot`: one panel per figure of the paper (a metric
/// of one model on one hardware setup that the paper reports), a bar per simulated row
/// beside the paper's value with its tolerance band ([`TOLERANCE`]).
pub fn reproduction(r: &Reproduction) -> String {
    // (model, hardware, metric) and the indices of its rows, in the rows' order.
    type Figure<'a> = ((&'a str, &'a str, &'a str), Vec<usize>);
    let mut groups: Vec<Figure> = Vec::new();
    for (i, row) in r.rows.iter().enumerate() {
        let key = (
            row.model.as_str(),
            row.hardware.as_str(),
            row.metric.as_str(),
        );
        match groups.iter_mut().find(|g| g.0 == key) {
            Some(g) => g.1.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let total = groups.len();
    groups.retain(|g| g.1.iter().any(|&i| r.rows[i].paper.is_some()));
    let cols = 3;
    let (pw, ph, sx, sy) = (300.0, 170.0, 350.0, 300.0);
    let height = 110.0 + sy * groups.len().div_ceil(cols) as f64;
    let title = format!("Reproduction of {} against the paper", r.reproduce);
    let mut svg = Svg::new(60.0 + sx * cols as f64, height, &title);
    svg.text(20.0, 24.0, 15.0, "start", &title);
    svg.text(
        20.0,
        44.0,
        11.0,
        "start",
        &format!(
            "{} figures the paper reports; {} further metrics without a paper value are in \
             the table (strata simulate --reproduce {}).",
            groups.len(),
            total - groups.len(),
            r.reproduce
        ),
    );
    let keys = [
        (
            "#59a14f",
            format!("simulated, within ±{:.0}%", TOLERANCE * 100.0),
        ),
        ("#e15759", "simulated, outside".to_string()),
        ("#4e79a7", "simulated, no paper value".to_string()),
        ("#bbbbbb", "paper (bar: its tolerance)".to_string()),
    ];
    for (i, (fill, label)) in keys.iter().enumerate() {
        let x = 20.0 + 260.0 * i as f64;
        svg.rect(x, 58.0, 12.0, 10.0, fill, "none");
        svg.text(x + 16.0, 67.0, 11.0, "start", label);
    }
    for (g, ((model, hw, metric), rows)) in groups.iter().enumerate() {
        let p = Panel {
            x: 70.0 + sx * (g % cols) as f64,
            y: 110.0 + sy * (g / cols) as f64,
            w: pw,
            h: ph,
        };
        figure(&mut svg, &p, r, rows, [*metric, *model, *hw]);
    }
    svg.finish()
}

/// One figure's panel: bars for `rows` of `r`.
fn figure(
    svg: &mut Svg,
    p: &Panel,
    r: &Reproduction,
    rows: &[usize],
    [metric, model, hw]: [&str; 3],
) {
    let rs: Vec<_> = rows.iter().map(|&i| &r.rows[i]).collect();
    let values = rs
        .iter()
        .flat_map(|x| [Some(x.value), x.paper.map(|v| v * (1.0 + TOLERANCE))])
        .flatten()
        .filter(|v| v.is_finite());
    let (lo, hi) = values.fold((0.0f64, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    let ys = p.ys(lo, hi * 1.05, false);
    p.axes(svg, None, Some(&ys), [metric, "", ""]);
    svg.text(
        p.x + p.w / 2.0,
        p.y - 24.0,
        10.0,
        "middle",
        &format!("{model} on {hw}"),
    );
    // What tells the rows apart besides the policy.
    let varies = |f: fn(&&strata_sim::reproduce::Row) -> usize| {
        rs.iter()
            .map(f)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
    };
    let (by_batch, by_prompt) = (varies(|x| x.batch), varies(|x| x.prompt_tokens));
    let slot = p.w / rs.len() as f64;
    let base = ys.px(0.0);
    for (k, (&i, row)) in rows.iter().zip(&rs).enumerate() {
        let x = p.x + slot * k as f64;
        let fill = match agreement(row.value, row.paper).map(|(_, ok)| ok) {
            Some(true) => "#59a14f",
            Some(false) => "#e15759",
            None => "#4e79a7",
        };
        bar(
            svg,
            (x + slot * 0.12, slot * 0.36),
            (base, ys.px(row.value)),
            fill,
            ("simulated", i, row.value),
        );
        if let Some(paper) = row.paper {
            let bx = x + slot * 0.52;
            bar(
                svg,
                (bx, slot * 0.36),
                (base, ys.px(paper)),
                "#bbbbbb",
                ("paper", i, paper),
            );
            let cx = bx + slot * 0.18;
            let (a, b) = (
                ys.px(paper * (1.0 - TOLERANCE)),
                ys.px(paper * (1.0 + TOLERANCE)),
            );
            svg.line((cx, a), (cx, b), "#555", false);
            svg.line((cx - 3.0, a), (cx + 3.0, a), "#555", false);
            svg.line((cx - 3.0, b), (cx + 3.0, b), "#555", false);
        }
        let mut label = row.policy.clone();
        if by_batch {
            let _ = write!(label, " b{}", row.batch);
        }
        if by_prompt {
            let _ = write!(label, " p{}", row.prompt_tokens);
        }
        svg.text_rotated(x + slot / 2.0, p.y + p.h + 12.0, -35.0, "end", &label);
    }
}

/// One bar from pixel `base` to `top`, carrying its row index and value.
fn bar(
    svg: &mut Svg,
    (x, w): (f64, f64),
    (base, top): (f64, f64),
    fill: &str,
    data: (&str, usize, f64),
) {
    let (kind, row, value) = data;
    let (y, h) = (base.min(top), (base - top).abs());
    svg.raw(&format!(
        "<rect class=\"bar\" data-kind=\"{kind}\" data-row=\"{row}\" data-value=\"{value}\" \
         x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{fill}\">\
         <title>{kind}: {value:.4}</title></rect>"
    ));
}

/// `strata simulate --plot` (without `--reproduce`): every operation of the run on its
/// device lane over time.
pub fn timeline(report: &Report) -> String {
    let mut lanes: Vec<Lane> = vec![Lane::Gpu, Lane::Cpu, Lane::Pcie];
    for op in &report.ops {
        if !lanes.contains(&op.lane) {
            lanes.push(op.lane);
        }
    }
    lanes.sort();
    // Colours by the kind of work: the first word of an operation's name.
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for op in &report.ops {
        let kind = op.name.split_whitespace().next().unwrap_or("");
        let n = kinds.len();
        kinds.entry(kind).or_insert(n);
    }
    let end = report.ops.iter().map(|o| o.end).fold(0.0f64, f64::max);
    let row = 28.0;
    let p = Panel {
        x: 90.0,
        y: 60.0,
        w: 1080.0,
        h: row * lanes.len() as f64,
    };
    let height = p.y + p.h + 60.0 + 16.0 * kinds.len().div_ceil(4) as f64;
    let title = format!("Timeline of {} on {}", report.policy, report.hardware);
    let mut svg = Svg::new(1200.0, height, &title);
    svg.text(20.0, 24.0, 13.0, "start", &title);
    let xs = p.xs(0.0, end * 1e3, false);
    p.axes(&mut svg, Some(&xs), None, ["", "time (ms)", ""]);
    for (i, lane) in lanes.iter().enumerate() {
        let y = p.y + row * i as f64;
        svg.text(p.x - 6.0, y + row / 2.0 + 4.0, 11.0, "end", &lane.label());
        for op in report.ops.iter().filter(|o| o.lane == *lane) {
            let kind = op.name.split_whitespace().next().unwrap_or("");
            let (x0, x1) = (xs.px(op.start * 1e3), xs.px(op.end * 1e3));
            svg.raw(&format!(
                "<rect class=\"op\" data-lane=\"{}\" data-name=\"{}\" data-start=\"{}\" \
                 data-end=\"{}\" x=\"{x0:.2}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{:.1}\" \
                 fill=\"{}\"><title>{} (step {}, layer {})</title></rect>",
                esc(&lane.label()),
                esc(&op.name),
                op.start,
                op.end,
                y + 3.0,
                (x1 - x0).max(0.3),
                row - 6.0,
                color(kinds[kind]),
                esc(&op.name),
                op.step,
                op.layer,
            ));
        }
    }
    let keys: Vec<(String, String)> = kinds
        .iter()
        .map(|(k, &i)| (color(i).to_string(), k.to_string()))
        .collect();
    for (i, chunk) in keys.chunks(4).enumerate() {
        for (j, key) in chunk.iter().enumerate() {
            let y = p.y + p.h + 50.0 + 16.0 * i as f64;
            svg.legend(p.x + 160.0 * j as f64, y, std::slice::from_ref(key));
        }
    }
    svg.finish()
}
