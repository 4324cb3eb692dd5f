//! `--plot FILE.svg` (issue #15), run as a user runs it: every picture parses as XML, has
//! one series per layer or format as it claims, and the numbers its marks carry (their
//! `data-*` attributes) are those of the JSON the same command prints or writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn strata(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "strata {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-plot-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Elements of `doc` whose `class` is `class`.
fn marks<'a>(doc: &'a roxmltree::Document<'a>, class: &str) -> Vec<roxmltree::Node<'a, 'a>> {
    doc.descendants()
        .filter(|n| n.attribute("class") == Some(class))
        .collect()
}

fn num(n: &roxmltree::Node, attr: &str) -> f64 {
    let v = n
        .attribute(attr)
        .unwrap_or_else(|| panic!("no {attr} on {n:?}"));
    v.parse()
        .unwrap_or_else(|_| panic!("{attr}={v:?} is not a number"))
}

fn nums(n: &roxmltree::Node, attr: &str) -> Vec<f64> {
    let v = n
        .attribute(attr)
        .unwrap_or_else(|| panic!("no {attr} on {n:?}"));
    v.split(' ').map(|x| x.parse().unwrap()).collect()
}

/// `got` equals `want` up to serde_json's parsing: without its `float_roundtrip` feature
/// it may land an ulp or two from the printed number, which the SVG holds exactly.
fn same(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-14 * want.abs(),
        "{what}: {got} vs {want}"
    );
}

fn same_all(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        same(*g, *w, what);
    }
}

fn read_svg(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap();
    assert!(text.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    text
}

/// `strata trace --plot`: the heat map holds each layer's experts ranked by load with their
/// share, and the curves the cumulative shares, as counted here from the written trace.
#[test]
fn trace_plot_shows_the_load_of_the_written_trace() {
    let dir = scratch("trace");
    let prompts = dir.join("prompts.txt");
    std::fs::write(
        &prompts,
        "How do I sort a list in Python?\nWrite a haiku about autumn.\nWhat is an expert?\n",
    )
    .unwrap();
    let (trace, svg) = (dir.join("trace.jsonl"), dir.join("load.svg"));
    strata(&[
        "trace",
        "--prompts",
        path(&prompts),
        "--out",
        path(&trace),
        "--plot",
        path(&svg),
        "--decode",
        "4",
        "--no-hidden",
    ]);
    let text = std::fs::read_to_string(&trace).unwrap();
    let mut lines = text.lines();
    let header: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    let layers = header["moe_layers"].as_u64().unwrap() as usize;
    let experts = header["n_experts"].as_u64().unwrap() as usize;
    let mut counts = vec![vec![0u64; experts]; layers];
    for line in lines {
        let r: Value = serde_json::from_str(line).unwrap();
        let l = r["layer"].as_u64().unwrap() as usize;
        for id in r["ids"].as_array().unwrap() {
            counts[l][id.as_u64().unwrap() as usize] += 1;
        }
    }
    let svg_text = read_svg(&svg);
    let doc = roxmltree::Document::parse(&svg_text).unwrap();
    let cells = marks(&doc, "cell");
    assert_eq!(cells.len(), layers * experts);
    let series = marks(&doc, "series");
    assert_eq!(series.len(), layers, "one curve per MoE layer");
    for (l, layer) in counts.iter().enumerate() {
        let total = layer.iter().sum::<u64>() as f64;
        let mut ranked: Vec<(usize, u64)> = layer.iter().copied().enumerate().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut cum = Vec::new();
        for (r, &(e, c)) in ranked.iter().enumerate() {
            let cell = cells
                .iter()
                .find(|n| num(n, "data-layer") == l as f64 && num(n, "data-rank") == r as f64)
                .unwrap_or_else(|| panic!("no cell for layer {l} rank {r}"));
            assert_eq!(num(cell, "data-expert"), e as f64, "layer {l} rank {r}");
            assert_eq!(
                num(cell, "data-share"),
                c as f64 / total,
                "layer {l} rank {r}"
            );
            cum.push(cum.last().copied().unwrap_or(0.0) + c as f64 / total);
        }
        let s = &series[l];
        assert_eq!(
            s.attribute("data-series"),
            Some(format!("layer {l}").as_str())
        );
        let got = nums(s, "data-y");
        assert_eq!(got.len(), experts);
        for (g, w) in got.iter().zip(&cum) {
            assert!((g - w).abs() < 1e-12, "layer {l}: {got:?} vs {cum:?}");
        }
        assert!((got[experts - 1] - 1.0).abs() < 1e-9);
    }
}

/// `strata bench moe --plot` (the shipped model's expert shape): one TFLOPS and one GB/s
/// series per format, equal to the printed results; a ceiling per measured peak.
#[test]
fn bench_plot_shows_the_printed_results_under_the_peaks() {
    let dir = scratch("bench");
    let svg = dir.join("roofline.svg");
    let o = strata(&[
        "bench",
        "moe",
        "--hidden",
        "256",
        "--inter",
        "128",
        "--experts",
        "32",
        "--topk",
        "4",
        "--tokens",
        "1,8,64",
        "--formats",
        "bf16,int8,q8_0",
        "--min-seconds",
        "0.01",
        "--json",
        "--plot",
        path(&svg),
    ]);
    let doc_json: Value = serde_json::from_slice(&o.stdout).unwrap();
    let svg_text = read_svg(&svg);
    let doc = roxmltree::Document::parse(&svg_text).unwrap();
    let series = marks(&doc, "series");
    assert_eq!(series.len(), 3 * 2, "a TFLOPS and a GB/s series per format");
    // (format, quantity) -> (tokens per expert, values).
    type Series = (Vec<f64>, Vec<f64>);
    let mut want: BTreeMap<(String, &str), Series> = BTreeMap::new();
    for r in doc_json["results"].as_array().unwrap() {
        for q in ["tflops", "weight_gbs"] {
            let e = want
                .entry((r["format"].as_str().unwrap().to_owned(), q))
                .or_default();
            e.0.push(r["tokens_per_expert"].as_f64().unwrap());
            e.1.push(r[q].as_f64().unwrap());
        }
    }
    for s in &series {
        let key = (
            s.attribute("data-series").unwrap().to_owned(),
            s.attribute("data-quantity").unwrap(),
        );
        let (x, y) = want
            .remove(&(key.0.clone(), key.1))
            .expect("a series per format");
        same_all(&nums(s, "data-x"), &x, &format!("{key:?}"));
        same_all(&nums(s, "data-y"), &y, &format!("{key:?}"));
    }
    assert!(want.is_empty(), "series missing: {want:?}");
    let ceilings = marks(&doc, "ceiling");
    let peaks = doc_json["peaks"].as_object().unwrap();
    let measured = peaks.values().filter(|v| v.is_number()).count();
    assert_eq!(ceilings.len(), measured, "a ceiling per measured peak");
    for c in &ceilings {
        let name = c.attribute("data-name").unwrap();
        same(num(c, "data-value"), peaks[name].as_f64().unwrap(), name);
    }
}

/// `strata simulate --reproduce ktransformers --plot`: each figure the paper reports has a
/// bar per simulated row and the paper's value beside it, equal to the printed rows.
#[test]
fn reproduction_plot_puts_the_paper_beside_the_simulation() {
    let dir = scratch("reproduce");
    let svg = dir.join("ktransformers.svg");
    let o = strata(&[
        "simulate",
        "--reproduce",
        "ktransformers",
        "--json",
        "--plot",
        path(&svg),
    ]);
    let doc_json: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = doc_json["rows"].as_array().unwrap();
    let svg_text = read_svg(&svg);
    let doc = roxmltree::Document::parse(&svg_text).unwrap();
    let bars = marks(&doc, "bar");
    // The rows of every (model, hardware, metric) with a paper value are drawn.
    let key = |r: &Value| {
        (
            r["model"].clone(),
            r["hardware"].clone(),
            r["metric"].clone(),
        )
    };
    let figures: Vec<_> = rows
        .iter()
        .filter(|r| r["paper"].is_number())
        .map(key)
        .collect();
    let drawn: Vec<usize> = (0..rows.len())
        .filter(|&i| figures.contains(&key(&rows[i])))
        .collect();
    let with_paper = rows.iter().filter(|r| r["paper"].is_number()).count();
    assert!(with_paper > 0);
    let kind = |k: &str| {
        bars.iter()
            .filter(|b| b.attribute("data-kind") == Some(k))
            .count()
    };
    assert_eq!(kind("simulated"), drawn.len());
    assert_eq!(kind("paper"), with_paper);
    for b in &bars {
        let i = num(b, "data-row") as usize;
        assert!(
            drawn.contains(&i),
            "row {i} is not part of a paper's figure"
        );
        let field = match b.attribute("data-kind").unwrap() {
            "simulated" => "value",
            _ => "paper",
        };
        same(
            num(b, "data-value"),
            rows[i][field].as_f64().unwrap(),
            &format!("row {i}"),
        );
    }
}

/// `strata simulate --timeline FILE --plot FILE.svg` on the shipped model's shape: every
/// operation of the Perfetto trace is a bar on its device's lane, at the same times.
#[test]
fn timeline_plot_draws_every_operation_of_the_perfetto_trace() {
    let dir = scratch("timeline");
    let (json, svg) = (dir.join("timeline.json"), dir.join("timeline.svg"));
    let model = root().join("models/strata-tiny-moe");
    strata(&[
        "simulate",
        "--model",
        path(&model),
        "--prompt-tokens",
        "16",
        "--decode-tokens",
        "8",
        "--timeline",
        path(&json),
        "--plot",
        path(&svg),
    ]);
    let trace: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let lane_names: BTreeMap<u64, &str> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    let svg_text = read_svg(&svg);
    let doc = roxmltree::Document::parse(&svg_text).unwrap();
    let ops = marks(&doc, "op");
    let ops_x: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert!(!ops_x.is_empty());
    assert_eq!(ops.len(), ops_x.len(), "one bar per operation");
    for (&tid, lane) in &lane_names {
        let want: Vec<_> = ops_x.iter().filter(|e| e["tid"] == tid).collect();
        let got: Vec<_> = ops
            .iter()
            .filter(|o| o.attribute("data-lane") == Some(*lane))
            .collect();
        assert_eq!(got.len(), want.len(), "lane {lane}");
        for (g, w) in got.iter().zip(&want) {
            let (start, end) = (num(g, "data-start"), num(g, "data-end"));
            assert_eq!(g.attribute("data-name"), w["name"].as_str());
            same(start * 1e6, w["ts"].as_f64().unwrap(), lane);
            same((end - start) * 1e6, w["dur"].as_f64().unwrap(), lane);
        }
    }
}
