//! The whole model on the accelerator against the CPU f32 path on every test fixture:
//! all at once and token by token through the device KV cache, within 1e-3 x max|ref|.

mod common;

use std::path::{Path, PathBuf};

use common::default_gpu;
use strata_exec::GpuModel;
use strata_model::{LogitsWanted, Model, Precision, SeqInput};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn tokens(dir: &Path) -> Vec<Vec<u32>> {
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    r["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s.as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
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

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / max_ref
}

fn check(name: &str) {
    let Some(dev) = default_gpu() else { return };
    let dir = fixture(name);
    let cpu = Model::load(&dir, Precision::F32).unwrap();
    let gpu = GpuModel::load(dev, &dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (i, toks) in tokens(&dir).iter().enumerate() {
        let want = cpu_logits(&cpu, toks);
        for chunk in [toks.len(), 1] {
            let mut cache = gpu.new_cache(toks.len()).unwrap();
            let mut got = Vec::new();
            for part in toks.chunks(chunk) {
                got.extend(gpu.forward(part, &mut cache).unwrap());
            }
            let e = rel_err(&got, &want);
            println!("{name} seq {i} chunk {chunk}: max rel err {e:.2e}");
            assert!(
                e <= 1e-3,
                "{name} seq {i} chunk {chunk}: error {e:.2e} > 1e-3"
            );
        }
    }
}

macro_rules! fixtures {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            check(stringify!($name));
        }
    )*};
}

fixtures!(
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
    deepseek_v3_greedy,
    deepseek_v3_fp8
);

#[test]
fn cache_overflow_and_bad_tokens_are_errors() {
    let Some(dev) = default_gpu() else { return };
    let gpu = GpuModel::load(dev, &fixture("llama")).unwrap();
    let mut cache = gpu.new_cache(2).unwrap();
    assert!(gpu.forward(&[1, 2, 3], &mut cache).is_err());
    assert!(gpu.forward(&[100_000], &mut cache).is_err());
    assert_eq!(cache.len(), 0);
}

/// The trained `strata-tiny-moe` (BF16, 8192-token vocabulary): a real checkpoint with
/// bigger shapes than the fixtures (head_dim 64, 256-wide rows, many expert rows per pair).
#[test]
fn strata_tiny_moe_matches_cpu() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/strata-tiny-moe");
    if !dir.join("config.json").exists() {
        eprintln!("skipping: {} not found", dir.display());
        return;
    }
    let Some(dev) = default_gpu() else { return };
    let cpu = Model::load(&dir, Precision::F32).unwrap();
    let gpu = GpuModel::load(dev, &dir).unwrap();
    let toks: Vec<u32> = (0..48u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 8192)
        .collect();
    let want = cpu_logits(&cpu, &toks);
    let mut cache = gpu.new_cache(toks.len()).unwrap();
    let mut got = gpu.forward(&toks[..40], &mut cache).unwrap();
    for tok in &toks[40..] {
        got.extend(gpu.forward(std::slice::from_ref(tok), &mut cache).unwrap());
    }
    let e = rel_err(&got, &want);
    println!("strata-tiny-moe: max rel err {e:.2e}");
    assert!(e <= 1e-3, "strata-tiny-moe: error {e:.2e} > 1e-3");
}

/// A decoded token costs the host one round trip (its logits) and one submission (the
/// token's uploads go with the step): routing is grouped on the device, not read back per
/// MoE layer.
#[test]
fn a_decoded_token_is_one_host_round_trip() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/strata-tiny-moe");
    if !dir.join("config.json").exists() {
        eprintln!("skipping: {} not found", dir.display());
        return;
    }
    let Some(dev) = default_gpu() else { return };
    let gpu = GpuModel::load(dev.clone(), &dir).unwrap();
    let toks: Vec<u32> = (0..24u32).map(|i| (i * 37 + 11) % 8192).collect();
    let mut cache = gpu.new_cache(toks.len()).unwrap();
    gpu.forward(&toks[..16], &mut cache).unwrap();
    let before = dev.traffic();
    for tok in &toks[16..] {
        gpu.forward(std::slice::from_ref(tok), &mut cache).unwrap();
    }
    let steps = (toks.len() - 16) as u64;
    let decode = dev.traffic().since(before);
    assert_eq!(
        decode.downloads, steps,
        "host round trips in {steps} steps: {decode:?}"
    );
    assert!(
        decode.submissions <= steps,
        "submissions in {steps} steps: {decode:?}"
    );
}

/// A model larger than the device budget is refused before anything runs, with what its
/// weights take and what to do instead.
#[test]
fn a_model_over_the_vram_budget_is_refused_with_what_it_needs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/strata-tiny-moe");
    if !dir.join("config.json").exists() || default_gpu().is_none() {
        eprintln!("skipping: no GPU or no {}", dir.display());
        return;
    }
    let err = GpuModel::load_on_first_device(&dir, Some(8 << 20)).unwrap_err();
    let msg = err.to_string();
    for want in [
        "does not fit the device budget of 8.0 MiB",
        "--vram-budget",
        "--device hybrid",
    ] {
        assert!(msg.contains(want), "{msg}");
    }
    GpuModel::load_on_first_device(&dir, Some(1 << 30)).unwrap();
}
