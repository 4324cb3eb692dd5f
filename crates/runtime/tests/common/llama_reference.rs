//! llama.cpp's logits for the real GGUF assets (`tests/reference/*.json`, made by
//! `scripts/make_gguf_reference.py`) and the criteria any path's logits meet against them:
//! shared by the CPU path's test (`crates/runtime/tests/gguf_real.rs`) and the device's
//! (`crates/exec/tests/gpu_gguf_real.rs`, which includes this file).
//!
//! Needs the assets from `scripts/fetch_assets.sh`: runs when `STRATA_REAL_ASSETS=1` (and
//! fails if they are missing), prints a notice and passes otherwise.
//!
//! Criteria (issue #3): the same top-1 token at >= 94% of positions, every disagreement a
//! near-tie (the reference's logits of the two tokens within 0.5), and logits within
//! 0.1 x max|ref| at the reference's top-32 ids. llama.cpp quantizes activations to 8 bits
//! for quantized dot products, so exact agreement is not the goal.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The asset file, or `None` (with a notice) when real-asset tests are off.
pub fn asset(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("STRATA_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/assets"));
    let path = dir.join(file);
    if std::env::var("STRATA_REAL_ASSETS").as_deref() != Ok("1") {
        eprintln!("skipping: STRATA_REAL_ASSETS is not 1 (run scripts/fetch_assets.sh and set it)");
        return None;
    }
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch_assets.sh",
        path.display()
    );
    Some(path)
}

/// Positions where llama.cpp's own arithmetic is demonstrably off, excluded from the
/// near-tie and top-32 checks (still counted in the top-1 rate). Qwen2.5 "facts" position 12:
/// an independent f64 implementation (dequantized weights, plain torch) agrees with Strata to
/// 4.5e-6 x max|ref| over every position, while llama.cpp is off by 1.99 there; simulating
/// llama.cpp's 8-bit activation rounding moves the logits the same way (cosine 1.00), driven
/// by a 1000+ magnitude residual outlier at position 0 that position 12 attends to.
const REFERENCE_DEVIATIONS: &[(&str, &str, usize)] =
    &[("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "facts", 12)];

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Checks the logits `logits_of(prompt)` gives (`[tokens, vocab]` for a reference prompt,
/// whose `text`, `tokens` and `add_bos` the closure may read) against the reference of
/// `model_file` in `reference`, on `path` (the label of the printed figures).
pub fn check_logits(
    model_file: &str,
    reference: &str,
    path: &str,
    vocab: usize,
    mut logits_of: impl FnMut(&serde_json::Value, bool) -> Vec<f32>,
) {
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/reference").join(reference)).unwrap(),
    )
    .unwrap();
    let add_bos = reference["add_bos"].as_bool().unwrap();
    let (mut positions, mut agree, mut worst_tie, mut worst_rel) = (0usize, 0usize, 0.0f32, 0.0f32);
    for prompt in reference["prompts"].as_array().unwrap() {
        let logits = logits_of(prompt, add_bos);
        for (pos, want) in prompt["positions"].as_array().unwrap().iter().enumerate() {
            let row = &logits[pos * vocab..(pos + 1) * vocab];
            let top_ids = ids(&want["top_ids"]);
            let top_logits: Vec<f32> = want["top_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let max_abs = want["max_abs_logit"].as_f64().unwrap() as f32;
            let ours = row
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i as u32)
                .unwrap();
            positions += 1;
            let name = prompt["name"].as_str().unwrap();
            let known = REFERENCE_DEVIATIONS.contains(&(model_file, name, pos));
            if ours == top_ids[0] {
                agree += 1;
            } else if !known {
                let j = top_ids.iter().position(|&t| t == ours).unwrap_or_else(|| {
                    panic!("{model_file} ({path}) {name}: our top-1 {ours} is not in the reference's top-32 at {pos}")
                });
                worst_tie = worst_tie.max(top_logits[0] - top_logits[j]);
            }
            for (&id, &l) in top_ids.iter().zip(&top_logits).filter(|_| !known) {
                let e = (row[id as usize] - l).abs() / max_abs;
                worst_rel = worst_rel.max(e);
            }
        }
    }
    let rate = agree as f32 / positions as f32;
    println!(
        "{model_file} ({path}): top-1 agreement {rate:.3} over {positions} positions, worst disagreement gap {worst_tie:.3}, max error at top-32 {worst_rel:.3e} x max|ref|"
    );
    assert!(
        rate >= 0.94,
        "{model_file} ({path}): top-1 agreement {rate:.3} < 0.94"
    );
    assert!(
        worst_tie <= 0.5,
        "{model_file} ({path}): a disagreement is not a near-tie ({worst_tie:.3} > 0.5)"
    );
    assert!(
        worst_rel <= 0.1,
        "{model_file} ({path}): logits off by {worst_rel:.3} x max|ref| > 0.1"
    );
}
