//! The forward pass against Hugging Face transformers' logits: every fixture in
//! `tests/fixtures/` (tiny random checkpoints of every architecture, made by
//! `scripts/make_fixtures.py`) and the trained `strata-tiny-moe` shipped in `models/`.
//!
//! For each: the f32 path within 1e-3 x max|ref| at every position; the fast path's top-1
//! agrees at >= 95% of positions and stays within 5e-2 x max|ref|; whole-sequence,
//! `chunk = 5` and token-by-token runs agree; a batch of two sequences of different lengths
//! gives each sequence's own logits.

use std::path::{Path, PathBuf};

use strata_formats::npy;
use strata_model::{LogitsWanted, Model, Precision, SeqInput};

mod common;

use common::{compare, logits_chunked, repo_root};

/// Checks one model directory against reference sequences and logits.
fn check_model(dir: &Path, sequences: &[(Vec<u32>, Vec<f32>)]) {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let f32_model = Model::load_dir(dir, Precision::F32).unwrap_or_else(|e| panic!("{name}: {e}"));
    let vocab = f32_model.config.vocab_size;
    for (i, (tokens, want)) in sequences.iter().enumerate() {
        let whole = logits_chunked(&f32_model, tokens, tokens.len());
        let s = compare(&whole, want, vocab);
        println!(
            "{name} seq {i}: f32 max rel err {:.2e}, top-1 {:.3}",
            s.max_rel_err, s.top1_agree
        );
        assert!(
            s.max_rel_err <= 1e-3,
            "{name} seq {i}: f32 path error {:.2e} > 1e-3",
            s.max_rel_err
        );
        for chunk in [1, 5] {
            let c = logits_chunked(&f32_model, tokens, chunk);
            let s = compare(&c, want, vocab);
            assert!(
                s.max_rel_err <= 1e-3,
                "{name} seq {i}: chunk {chunk} error {:.2e} > 1e-3",
                s.max_rel_err
            );
        }
    }
    // Both sequences in one batch, different lengths.
    if sequences.len() >= 2 {
        let mut caches: Vec<_> = sequences.iter().map(|_| f32_model.new_cache()).collect();
        let mut seqs: Vec<SeqInput> = sequences
            .iter()
            .zip(caches.iter_mut())
            .map(|((tokens, _), cache)| SeqInput {
                tokens,
                cache,
                logits: LogitsWanted::All,
            })
            .collect();
        let outs = f32_model.forward(&mut seqs).unwrap();
        for (i, (out, (_, want))) in outs.iter().zip(sequences).enumerate() {
            let s = compare(out, want, vocab);
            assert!(
                s.max_rel_err <= 1e-3,
                "{name} batched seq {i}: error {:.2e}",
                s.max_rel_err
            );
        }
    }
    drop(f32_model);
    let fast = Model::load_dir(dir, Precision::Fast).unwrap();
    let (mut got_all, mut want_all) = (Vec::new(), Vec::new());
    for (tokens, want) in sequences {
        got_all.extend(logits_chunked(&fast, tokens, tokens.len()));
        want_all.extend_from_slice(want);
    }
    let s = compare(&got_all, &want_all, vocab);
    println!(
        "{name}: fast max rel err {:.2e}, top-1 {:.3}",
        s.max_rel_err, s.top1_agree
    );
    assert!(
        s.max_rel_err <= 5e-2,
        "{name}: fast path error {:.2e} > 5e-2",
        s.max_rel_err
    );
    assert!(
        s.top1_agree >= 0.95,
        "{name}: fast top-1 agreement {:.3} < 0.95",
        s.top1_agree
    );
}

#[test]
fn strata_tiny_moe_matches_transformers() {
    let dir = repo_root().join("models/strata-tiny-moe");
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("reference/reference.json")).unwrap(),
    )
    .unwrap();
    let sequences: Vec<(Vec<u32>, Vec<f32>)> = reference["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let tokens: Vec<u32> = p["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            let logits =
                npy::read_f32(&dir.join(format!("reference/prompt{i}_logits.npy"))).unwrap();
            assert_eq!(logits.shape[0], tokens.len());
            (tokens, logits.data)
        })
        .collect();
    check_model(&dir, &sequences);
}

fn fixture(name: &str) {
    let dir = repo_root().join("tests/fixtures").join(name);
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let sequences: Vec<(Vec<u32>, Vec<f32>)> = reference["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let tokens: Vec<u32> = s
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            let logits = npy::read_f32(&dir.join(format!("logits_{i}.npy"))).unwrap();
            assert_eq!(logits.shape[0], tokens.len());
            (tokens, logits.data)
        })
        .collect();
    check_model(&dir, &sequences);
}

macro_rules! fixtures {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            fixture(stringify!($name));
        }
    )*};
}

fixtures!(
    qwen3_moe,
    qwen3_moe_bf16,
    qwen3_moe_stacked,
    qwen2_moe,
    mixtral,
    deepseek_v2,
    deepseek_v3,
    deepseek_v3_greedy,
    deepseek_v3_fp8,
    glm4_moe,
    llama,
    qwen2,
);

/// Every fixture directory has a test above.
#[test]
fn every_fixture_is_tested() {
    let listed = [
        "qwen3_moe",
        "qwen3_moe_bf16",
        "qwen3_moe_stacked",
        "qwen2_moe",
        "mixtral",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v3_greedy",
        "deepseek_v3_fp8",
        "glm4_moe",
        "llama",
        "qwen2",
    ];
    for entry in std::fs::read_dir(repo_root().join("tests/fixtures")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        assert!(
            listed.contains(&name.as_str()),
            "fixture {name} has no test"
        );
    }
}

/// INT8 experts keep top-1 agreement with the f32 path at >= 95% of positions over all
/// fixtures and the trained model (issue #4); INT4's figure is printed, not asserted.
#[test]
fn quantized_experts_agree_with_f32() {
    use strata_kernels::PackedFormat;
    use strata_model::LoadOptions;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(repo_root().join("tests/fixtures"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    dirs.push(repo_root().join("models/strata-tiny-moe"));
    for (fmt, name) in [
        (PackedFormat::Int8 { group: None }, "int8"),
        (PackedFormat::Int4 { group: 32 }, "int4g32"),
    ] {
        let (mut agree, mut rows, mut worst) = (0usize, 0usize, 0.0f32);
        for dir in &dirs {
            let reference = Model::load_dir(dir, Precision::F32).unwrap();
            let quant = Model::load_dir(
                dir,
                LoadOptions {
                    precision: Precision::Fast,
                    experts: fmt,
                    keep_blocks: false,
                },
            )
            .unwrap();
            let vocab = reference.config.vocab_size;
            // A fixed pseudo-random sequence of 24 tokens per model.
            let tokens: Vec<u32> = (0..24u32).map(|i| (i * 7919 + 13) % vocab as u32).collect();
            let want = logits_chunked(&reference, &tokens, tokens.len());
            let got = logits_chunked(&quant, &tokens, tokens.len());
            let s = compare(&got, &want, vocab);
            agree += (s.top1_agree * tokens.len() as f32).round() as usize;
            rows += tokens.len();
            worst = worst.max(s.max_rel_err);
        }
        let rate = agree as f32 / rows as f32;
        println!(
            "{name} experts: top-1 agreement with f32 {rate:.3} over {rows} positions, max error {worst:.2e} x max|ref|"
        );
        if name == "int8" {
            assert!(
                rate >= 0.95,
                "int8 experts: top-1 agreement {rate:.3} < 0.95"
            );
        }
    }
}

/// The observer sees the routing of every MoE layer for every row of the batch.
#[test]
fn observer_sees_every_moe_layer() {
    struct Count(Vec<(usize, usize, usize)>);
    impl strata_model::ForwardObserver for Count {
        fn on_routing(
            &mut self,
            layer: usize,
            spans: &[strata_model::SeqSpan],
            routing: &strata_model::Routing,
            hidden: &[f32],
        ) {
            let rows: usize = spans.iter().map(|s| s.len).sum();
            assert_eq!(routing.tokens(), rows);
            self.0.push((layer, rows, hidden.len() / rows));
        }
    }
    let dir = repo_root().join("tests/fixtures/qwen3_moe");
    let model = Model::load_dir(&dir, Precision::F32).unwrap();
    let (mut a, mut b) = (model.new_cache(), model.new_cache());
    let mut seqs = [
        SeqInput {
            tokens: &[1, 2, 3],
            cache: &mut a,
            logits: LogitsWanted::Last,
        },
        SeqInput {
            tokens: &[4, 5],
            cache: &mut b,
            logits: LogitsWanted::Last,
        },
    ];
    let mut seen = Count(Vec::new());
    model.forward_observed(&mut seqs, &mut seen).unwrap();
    // qwen3_moe: layers 1 and 5 are MoE (decoder_sparse_step 2, mlp_only_layers [3]).
    assert_eq!(seen.0, vec![(1, 5, 40), (5, 5, 40)]);
}
