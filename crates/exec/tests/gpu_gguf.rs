//! Quantized GGUFs on the accelerator (`tests/fixtures-gguf/qwen3_moe_k.*`: one random
//! Qwen3-MoE quantized by llama-quantize `--pure` into each ggml type) against an exact
//! reader of the file (transformers on the weights dequantized by gguf-py): the device
//! keeps the types its kernels decode as the file's blocks, so it holds about the file's
//! bytes and computes the exact reader's function (f32 activations) within 1e-3 x max|ref|,
//! all at once and token by token; the other types are dequantized to F16 on upload, which
//! rounds the weights (within 1e-2).

mod common;

use std::path::{Path, PathBuf};

use common::default_gpu;
use strata_accel::WeightType;
use strata_exec::GpuModel;
use strata_formats::npy;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures-gguf")
}

fn sequences() -> Vec<Vec<u32>> {
    let path = fixtures().join("qwen3_moe_k.json");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    manifest["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let s = s.as_array().unwrap();
            s.iter().map(|t| t.as_u64().unwrap() as u32).collect()
        })
        .collect()
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let max_diff = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    max_diff / max_ref
}

/// `qwen3_moe_k.<suffix>.gguf` on the device: device memory within `max_bytes_ratio` of
/// the file's size, logits within `tol` of the dequantized reference with an f32 KV cache
/// (the whole sequence at once: the kernels' own error), and within `tol` or 3e-3, whichever
/// is larger, token by token through the default F16 cache (its rounding adds ~1e-3).
fn check(suffix: &str, max_bytes_ratio: f64, tol: f32) {
    let Some(dev) = default_gpu() else { return };
    let stem = format!("qwen3_moe_k.{suffix}");
    let path = fixtures().join(format!("{stem}.gguf"));
    let before = dev.memory().live;
    let gpu = GpuModel::load(dev.clone(), &path).unwrap_or_else(|e| panic!("{stem}: {e}"));
    let held = (dev.memory().live - before) as f64;
    let file = std::fs::metadata(&path).unwrap().len() as f64;
    println!(
        "{stem}: {:.2} MB on the device, file {:.2} MB",
        held / 1e6,
        file / 1e6
    );
    assert!(
        held <= max_bytes_ratio * file,
        "{stem}: the weights take {held} bytes on the device, {:.2}x the file's {file}",
        held / file
    );
    for (i, seq) in sequences().iter().enumerate() {
        let want = npy::read_f32(&fixtures().join(format!("{stem}.dequant_{i}.npy")))
            .unwrap()
            .data;
        for chunk in [seq.len(), 1] {
            let (mut cache, tol) = if chunk == 1 {
                (gpu.new_cache(seq.len()).unwrap(), tol.max(3e-3))
            } else {
                let f32_cache = gpu.new_cache_as(seq.len(), WeightType::F32);
                (f32_cache.unwrap(), tol)
            };
            let mut got = Vec::new();
            for part in seq.chunks(chunk) {
                got.extend(gpu.forward(part, &mut cache).unwrap());
            }
            let e = rel_err(&got, &want);
            println!("{stem} seq {i} chunk {chunk}: max rel err {e:.2e}");
            assert!(
                e <= tol,
                "{stem} seq {i} chunk {chunk}: error {e:.2e} > {tol:e}"
            );
        }
    }
}

macro_rules! on_device {
    ($($test:ident => $suffix:literal, $ratio:expr, $tol:expr;)*) => {$(
        #[test]
        fn $test() {
            check($suffix, $ratio, $tol);
        }
    )*};
}

on_device! {
    // Decoded by the device's kernels: the file's bytes (norms and router are f32 in the
    // file too), the exact reader's logits.
    q4_0_blocks_on_the_device => "q4_0", 1.02, 1e-3;
    q5_0_blocks_on_the_device => "q5_0", 1.02, 1e-3;
    q8_0_blocks_on_the_device => "q8_0", 1.02, 1e-3;
    q4_k_blocks_on_the_device => "q4_k", 1.02, 1e-3;
    q5_k_blocks_on_the_device => "q5_k", 1.02, 1e-3;
    q6_k_blocks_on_the_device => "q6_k", 1.02, 1e-3;
    iq4_xs_blocks_on_the_device => "iq4_xs", 1.02, 1e-3;
    // Dequantized to F16 on upload: 16 bits per weight.
    q4_1_as_f16_on_the_device => "q4_1", 4.0, 1e-2;
    q3_k_as_f16_on_the_device => "q3_k", 6.0, 1e-2;
}

/// After [`GpuModel::prepare_kernels`], a 160-token prefill (through the tiled kernels) and a decoded
/// token compile no kernel: the prepared set covers what the model dispatches.
#[test]
fn prepared_kernels_cover_prefill_and_decode() {
    let Some(dev) = default_gpu() else { return };
    let path = fixtures().join("qwen3_moe_k.q4_k.gguf");
    let gpu = GpuModel::load(dev.clone(), &path).unwrap();
    gpu.prepare_kernels();
    let prepared = dev.traffic().compiled;
    assert!(prepared > 0);
    let seq = &sequences()[0];
    let prompt: Vec<u32> = (0..160).map(|i| seq[i % seq.len()]).collect();
    let mut cache = gpu.new_cache(prompt.len() + 1).unwrap();
    gpu.forward(&prompt, &mut cache).unwrap();
    gpu.forward(&prompt[..1], &mut cache).unwrap();
    assert_eq!(
        dev.traffic().compiled,
        prepared,
        "kernels compiled after preparing"
    );
}

/// The hybrid executor's uploads: an expert of a GGUF goes to the device as the file's
/// blocks of its three matrices (gate, up and down of `*_exps`), nothing widened.
#[test]
fn an_expert_upload_moves_the_files_blocks() {
    let path = fixtures().join("qwen3_moe_k.q4_k.gguf");
    let host = strata_exec::HostExperts::open(&path).unwrap();
    let file = strata_formats::gguf::GgufFile::open(&path).unwrap();
    let format = host.format(1).unwrap();
    assert_eq!(
        (format.gate_up, format.down),
        (WeightType::Q4_K, WeightType::Q4_K)
    );
    let e = 5;
    let mut want = Vec::new();
    for part in ["gate", "up", "down"] {
        let stacked = file
            .tensor_bytes(&format!("blk.1.ffn_{part}_exps.weight"))
            .unwrap();
        let per_expert = stacked.len() / host.n_experts();
        want.extend_from_slice(&stacked[e * per_expert..][..per_expert]);
    }
    let got = host.expert_bytes(1, e as u32).unwrap();
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "expert {e}'s upload differs from the file's blocks"
    );
    // The cost model prices transfers at the file's bits per weight (Q4_K: 4.5).
    assert!(
        (host.bits_per_weight() - 4.5).abs() < 1e-9,
        "{}",
        host.bits_per_weight()
    );
}
