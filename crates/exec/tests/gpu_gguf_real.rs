//! Real GGUF models (SmolLM2-135M Q4_1, whose blocks the device holds as F16, and
//! Qwen2.5-Coder-0.5B Q4_K_M, held as stored) through `--device gpu`'s model against
//! llama.cpp's logits, by the same criteria as the CPU path (issue #27: "quantized types
//! top-1 agreement on the real GGUFs as the CPU path has"). Needs the assets (see
//! `llama_reference.rs`) and a device (`STRATA_GPU_TESTS=1` on lavapipe in CI).

mod common;
#[path = "../../runtime/tests/common/llama_reference.rs"]
mod llama_reference;

use llama_reference::{asset, check_logits, ids};
use strata_exec::GpuModel;

fn check_on_the_device(model_file: &str, reference: &str) {
    let Some(path) = asset(model_file) else {
        return;
    };
    let Some(dev) = common::default_gpu() else {
        return;
    };
    let gpu = GpuModel::load(dev, &path).unwrap();
    let vocab = gpu.config.vocab_size;
    check_logits(model_file, reference, "device", vocab, |prompt, _| {
        let tokens = ids(&prompt["tokens"]);
        let mut cache = gpu.new_cache(tokens.len()).unwrap();
        gpu.forward(&tokens, &mut cache).unwrap()
    });
}

#[test]
fn smollm2_on_the_device_matches_llama_cpp() {
    check_on_the_device(
        "smollm2-135m-instruct-q4_1.gguf",
        "smollm2-135m-instruct-q4_1.json",
    );
}

#[test]
fn qwen2_5_coder_on_the_device_matches_llama_cpp() {
    check_on_the_device(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.json",
    );
}
