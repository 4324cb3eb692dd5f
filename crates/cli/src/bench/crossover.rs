//! `strata bench moe --crossover`: where one expert's paths cross as its tokens grow, so that
//! the engine's thresholds come from measurements on each instruction set.
//!
//! Packed formats: AVX-512 against AMX. GGUF formats: the row-dot kernels on the blocks as
//! stored against tiles decoded to INT8 (VNNI) and to BF16 (AVX-512 or AMX), each on every
//! path the CPU runs, beside the path the engine takes by default (`GgmlPath::default_for`):
//! where the default is not the fastest, a threshold in `strata_kernels::ggml` is off for
//! this CPU. One expert per call, the next expert of the next layer each call, so its weights
//! come from DRAM, as a decoded token's or a prompt's experts do.

use serde_json::{Value, json};
use strata_kernels::ggml::{GgmlExperts, GgmlPath, GgmlType, fused_moe_ggml_along};
use strata_kernels::moe::group_by_expert;
use strata_kernels::{Isa, MoeExperts, MoeOptions, PackedFormat, fused_moe_with};

use super::{Lcg, time_calls};

/// Tokens per expert at which the paths are timed.
const TOKENS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];
/// Rounds over the paths at each token count; each path keeps its best round, so a moment of
/// noise on a shared host does not decide the crossover.
const ROUNDS: usize = 3;

/// Times one packed expert with `m` tokens on AVX-512 and on AMX (when present).
pub(crate) fn packed(
    layer: &MoeExperts,
    fmt: PackedFormat,
    min_s: f64,
    rng: &mut Lcg,
) -> anyhow::Result<Vec<Value>> {
    let h = layer.hidden();
    let mut v = Vec::new();
    for m in TOKENS {
        let x = rng.vec(m * h, 2.0);
        let mut out = vec![0.0f32; m * h];
        let mut row = json!({"format": fmt.name(), "tokens_per_expert": m});
        for isa in Isa::available().into_iter().filter(|i| *i >= Isa::Avx512) {
            let opts = MoeOptions {
                isa: Some(isa),
                ..MoeOptions::default()
            };
            let s = time_calls(min_s, |c| {
                // One expert per call, rotating so its weights come from DRAM.
                let ids = vec![(c % layer.len()) as u32; m];
                fused_moe_with(layer, &x, &ids, &vec![1.0; m], &mut out, &opts)?;
                Ok(())
            })?;
            row[format!("{}_seconds", isa.name())] = json!(s);
        }
        v.push(row);
    }
    Ok(v)
}

/// Times one GGUF expert of `ty` with `m` tokens along every path this CPU runs, the paths
/// alternating over [`ROUNDS`] rounds, and names the fastest and the default.
pub(crate) fn ggml(
    layers: &[GgmlExperts],
    ty: GgmlType,
    min_s: f64,
    rng: &mut Lcg,
) -> anyhow::Result<Vec<Value>> {
    let isa = Isa::selected();
    let paths = GgmlPath::available(isa);
    let (h, e) = (layers[0].hidden(), layers[0].len());
    let name = ty.name().to_ascii_lowercase();
    let mut next = 0usize;
    let mut v = Vec::new();
    for m in TOKENS {
        let x = rng.vec(m * h, 2.0);
        let mut out = vec![0.0f32; m * h];
        let mut best = vec![f64::INFINITY; paths.len()];
        for _ in 0..ROUNDS {
            for (p, &path) in paths.iter().enumerate() {
                let opts = MoeOptions::default();
                let s = time_calls(min_s / ROUNDS as f64, |_| {
                    let (layer, expert) = ((next / e) % layers.len(), next % e);
                    next += 1;
                    let batches = group_by_expert(e, &vec![expert as u32; m], &vec![1.0; m], 1)?;
                    fused_moe_ggml_along(&layers[layer], &x, &batches, &mut out, &opts, path)?;
                    Ok(())
                })?;
                best[p] = best[p].min(s);
            }
        }
        let fastest = (0..paths.len()).min_by(|&a, &b| best[a].total_cmp(&best[b]));
        let timed: Vec<Value> = paths
            .iter()
            .zip(&best)
            .map(|(path, s)| json!({"path": path.name(), "seconds": s}))
            .collect();
        v.push(json!({
            "format": name,
            "tokens_per_expert": m,
            "paths": timed,
            "fastest": fastest.map(|p| paths[p].name()),
            "default": GgmlPath::default_for(isa, ty, m).name(),
        }));
    }
    Ok(v)
}

/// The fewest tokens per expert from which `key` (`fastest` or `default`) names a tile path
/// at every larger count timed, if any.
fn tiles_from(rows: &[&Value], key: &str) -> Option<u64> {
    let mut from = None;
    for r in rows {
        if r[key]
            .as_str()
            .is_some_and(|p| p != GgmlPath::RowDot.name())
        {
            from = from.or(r["tokens_per_expert"].as_u64());
        } else {
            from = None;
        }
    }
    from
}

/// One line per crossover row of the JSON document, and after a GGUF format's rows where its
/// tiles take over, measured and by default.
pub(crate) fn lines(doc: &Value) -> Vec<String> {
    let mut out = row_lines(doc);
    let rows: Vec<&Value> = doc["crossover"].as_array().into_iter().flatten().collect();
    let ggml = rows.iter().filter(|r| r["paths"].is_array());
    let mut formats: Vec<&str> = ggml.filter_map(|r| r["format"].as_str()).collect();
    formats.dedup();
    let from = |n: Option<u64>| {
        n.map_or("never".to_string(), |n| {
            format!("from {n} tokens per expert")
        })
    };
    for f in formats {
        let of: Vec<&Value> = rows.iter().copied().filter(|r| r["format"] == f).collect();
        out.push(format!(
            "crossover {f}: tiles fastest {}, by default {}",
            from(tiles_from(&of, "fastest")),
            from(tiles_from(&of, "default"))
        ));
    }
    out
}

/// One line per crossover row of the JSON document.
fn row_lines(doc: &Value) -> Vec<String> {
    let ms = |v: &Value| match v.as_f64() {
        Some(s) => format!("{:.3}", s * 1e3),
        None => "n/a".to_string(),
    };
    let mut out = Vec::new();
    for c in doc["crossover"].as_array().into_iter().flatten() {
        // Widths apply to strings and integers, not to JSON values.
        let head = format!(
            "crossover {:<8} m={:>4}:",
            c["format"].as_str().unwrap_or("?"),
            c["tokens_per_expert"].as_u64().unwrap_or(0)
        );
        out.push(match c["paths"].as_array() {
            Some(paths) => {
                let times: Vec<String> = paths
                    .iter()
                    .map(|p| {
                        format!(
                            "{} {} ms",
                            p["path"].as_str().unwrap_or("?"),
                            ms(&p["seconds"])
                        )
                    })
                    .collect();
                let (fastest, default) = (&c["fastest"], &c["default"]);
                let flag = if fastest == default {
                    ""
                } else {
                    "  <- default not the fastest"
                };
                format!(
                    "{head} {}; fastest {}, default {}{flag}",
                    times.join(", "),
                    fastest.as_str().unwrap_or("?"),
                    default.as_str().unwrap_or("?")
                )
            }
            None => format!(
                "{head} avx512 {} ms, amx {} ms",
                ms(&c["avx512_seconds"]),
                ms(&c["amx_seconds"])
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::lines;

    /// The summary names where the tiles stay ahead at every larger count, measured and by
    /// default; a format whose tiles never lead says so.
    #[test]
    fn summary_names_where_the_tiles_take_over() {
        let row = |format: &str, m: u64, fastest: &str, default: &str| {
            json!({"format": format, "tokens_per_expert": m, "fastest": fastest,
                   "default": default, "paths": [{"path": "row-dot", "seconds": 0.001}]})
        };
        let (r, t) = ("row-dot", "int8-tiles");
        let doc = json!({"crossover": [
            row("q4_k", 4, r, r), row("q4_k", 8, t, r), row("q4_k", 16, r, t),
            row("q4_k", 32, t, t), row("q4_k", 64, "bf16-tiles", t),
            row("q8_0", 4, r, r), row("q8_0", 8, r, r),
        ]});
        let out = lines(&doc);
        assert_eq!(out.len(), 9, "{out:?}");
        assert!(out[2].ends_with("<- default not the fastest"), "{out:?}");
        assert_eq!(
            out[7],
            "crossover q4_k: tiles fastest from 32 tokens per expert, by default from 16 tokens \
             per expert"
        );
        assert_eq!(
            out[8],
            "crossover q8_0: tiles fastest never, by default never"
        );
    }
}
