//! Converted models (`strata convert`) on the accelerator: every fixture converted on the
//! f32 path runs on the device within 1e-3 x max|ref| of the CPU f32 path on its source;
//! converted with packed BF16, int8 or int4 experts, within a looser bound of the CPU
//! running the same file (the CPU rounds activations to BF16 or quantizes them per token,
//! the device keeps them f32), and measurably apart from the unquantized source, so the
//! device is shown to read the file's packed weights.

mod common;

use std::path::{Path, PathBuf};

use common::default_gpu;
use serde_json::json;
use strata_exec::GpuModel;
use strata_kernels::PackedFormat;
use strata_model::linear::write_converted;
use strata_model::model::open;
use strata_model::{LoadOptions, LogitsWanted, Model, Precision, SeqInput};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-accel-converted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn convert(src: &Path, opts: LoadOptions, out: &Path) {
    let (config, source) = open(src).unwrap();
    let (_, rec) = Model::convert(config.clone(), &source, opts).unwrap();
    write_converted(out, &config, opts, &rec, &[], json!({})).unwrap();
}

fn tokens(vocab: usize) -> Vec<u32> {
    (0..9u32).map(|i| (i * 37 + 3) % vocab as u32).collect()
}

fn cpu_logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    let mut seqs = [SeqInput {
        tokens,
        cache: &mut cache,
        logits: LogitsWanted::All,
    }];
    model.forward(&mut seqs).unwrap().remove(0)
}

/// Prefill all but the last two tokens, then decode them one at a time.
fn gpu_logits(gpu: &GpuModel, tokens: &[u32]) -> Vec<f32> {
    let mut cache = gpu.new_cache(tokens.len()).unwrap();
    let split = tokens.len() - 2;
    let mut got = gpu.forward(&tokens[..split], &mut cache).unwrap();
    for t in &tokens[split..] {
        got.extend(gpu.forward(std::slice::from_ref(t), &mut cache).unwrap());
    }
    got
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / max_ref
}

/// Converts `name` with `opts`; returns (device vs CPU on the file, device on the file vs
/// CPU f32 on the source).
fn errors(name: &str, opts: LoadOptions, tag: &str) -> Option<(f32, f32)> {
    let dev = default_gpu()?;
    let src = fixture(name);
    let out = tmp(&format!("{name}-{tag}.strata"));
    convert(&src, opts, &out);
    let cpu_file = Model::load(&out, opts).unwrap();
    let cpu_src = Model::load(&src, Precision::F32).unwrap();
    let gpu = GpuModel::load(dev, &out).unwrap_or_else(|e| panic!("{name} {tag}: {e}"));
    let toks = tokens(gpu.config.vocab_size);
    let got = gpu_logits(&gpu, &toks);
    let e_file = rel_err(&got, &cpu_logits(&cpu_file, &toks));
    let e_src = rel_err(&got, &cpu_logits(&cpu_src, &toks));
    println!("{name} {tag}: vs CPU on the file {e_file:.2e}, vs f32 source {e_src:.2e}");
    std::fs::remove_file(&out).unwrap();
    Some((e_file, e_src))
}

fn f32_path(name: &str) {
    let Some((e_file, e_src)) = errors(name, Precision::F32.into(), "f32") else {
        return;
    };
    assert!(e_file <= 1e-3, "{name}: {e_file:.2e} > 1e-3");
    assert!(e_src <= 1e-3, "{name}: {e_src:.2e} > 1e-3");
}

fn packed(name: &str, experts: PackedFormat, bound: f32) {
    let opts = LoadOptions {
        precision: Precision::Fast,
        experts,
        keep_blocks: false,
    };
    let Some((e_file, e_src)) = errors(name, opts, &experts.name()) else {
        return;
    };
    assert!(e_file <= bound, "{name}: {e_file:.2e} > {bound:.0e}");
    // Quantized experts move the logits: the device must not have read other weights.
    if experts != PackedFormat::Bf16 {
        assert!(
            e_src > 1e-4,
            "{name}: {e_src:.2e}, quantization not visible"
        );
    }
}

macro_rules! f32_fixtures {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            f32_path(stringify!($name));
        }
    )*};
}

f32_fixtures!(
    llama,
    qwen2,
    qwen2_moe,
    qwen3_moe,
    qwen3_moe_bf16,
    qwen3_moe_stacked,
    mixtral,
    glm4_moe,
    deepseek_v2,
    deepseek_v3,
    deepseek_v3_fp8
);

#[test]
fn packed_bf16_experts() {
    for name in ["qwen3_moe_bf16", "qwen2_moe"] {
        packed(name, PackedFormat::Bf16, 1e-2);
    }
}

#[test]
fn packed_int8_experts() {
    for name in ["qwen3_moe", "mixtral", "deepseek_v3"] {
        packed(name, PackedFormat::Int8 { group: None }, 1e-2);
    }
}

#[test]
fn packed_int4_experts() {
    for name in ["qwen3_moe_stacked", "glm4_moe"] {
        packed(name, PackedFormat::Int4 { group: 32 }, 1e-2);
    }
}
