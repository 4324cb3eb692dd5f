//! The hybrid executor on converted models (`strata convert`): routed experts uploaded
//! from the file's packed or plain experts give the logits of the CPU running the same
//! file: within 2e-5 x max|ref| on the f32 path, within 1e-2 with packed BF16 or int8
//! experts (the CPU rounds or quantizes activations, the device keeps them f32).
//!
//! Needs an accelerator (Mesa's lavapipe in CI): skipped without one, unless
//! `STRATA_GPU_TESTS=1` makes that a failure.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use strata_exec::{
    ExecOptions, HostExperts, HybridExecutor, PolicyKind, PolicyOptions, build_policy, cost_model,
    install, model_shape,
};
use strata_kernels::PackedFormat;
use strata_model::linear::write_converted;
use strata_model::model::open;
use strata_model::{LoadOptions, LogitsWanted, Model, Precision, SeqInput};
use strata_policy::Hardware;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-exec-converted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Prefill then two decode steps; every logit.
fn run(model: &Model) -> Vec<f32> {
    let v = model.config.vocab_size as u32;
    let toks: Vec<u32> = (0..8u32).map(|i| (i * 37 + 3) % v).collect();
    let mut cache = model.new_cache();
    let mut out = Vec::new();
    for part in [&toks[..6], &toks[6..7], &toks[7..]] {
        let mut seqs = [SeqInput {
            tokens: part,
            cache: &mut cache,
            logits: LogitsWanted::All,
        }];
        out.extend(model.forward(&mut seqs).unwrap().remove(0));
    }
    out
}

fn check(name: &str, opts: LoadOptions, bound: f32) {
    let Some(dev) = common::default_gpu() else {
        return;
    };
    let src = fixture(name);
    let tag = match opts.precision {
        Precision::F32 => "f32".to_owned(),
        Precision::Fast => opts.experts.name(),
    };
    let out = tmp(&format!("{name}-{tag}.strata"));
    let (config, source) = open(&src).unwrap();
    let (_, rec) = Model::convert(config.clone(), &source, opts).unwrap();
    write_converted(&out, &config, opts, &rec, &[], json!({})).unwrap();

    let want = run(&Model::load(&out, opts).unwrap());
    let mut model = Model::load(&out, opts).unwrap();
    let host = HostExperts::open(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
    let budget = 64 * host.slot_bytes();
    let cost = cost_model(
        Hardware::load("ktrans-4080").unwrap(),
        model_shape(&model.config).unwrap(),
        host.bits_per_weight(),
        HybridExecutor::cache_bytes(&host, budget),
    )
    .unwrap();
    let policy = build_policy(PolicyKind::GpuLru, &cost, &PolicyOptions::default());
    let exec = Arc::new(
        HybridExecutor::new(
            dev,
            host,
            policy,
            cost,
            &ExecOptions {
                vram_budget: budget,
                ..ExecOptions::default()
            },
        )
        .unwrap(),
    );
    install(&mut model, Some(&exec));
    let got = run(&model);
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(&want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / max_ref;
    let stats = exec.stats();
    println!("{name} {tag}: {err:.2e} ({stats})");
    assert!(stats.gpu_experts > 0, "{name}: nothing ran on the device");
    assert!(err <= bound, "{name}: {err:.2e} > {bound:.0e}");
    std::fs::remove_file(&out).unwrap();
}

#[test]
fn f32_converted_experts_match_the_cpu() {
    for name in ["qwen3_moe", "qwen3_moe_stacked", "mixtral", "deepseek_v3"] {
        check(name, Precision::F32.into(), 2e-5);
    }
}

#[test]
fn packed_converted_experts_match_the_cpu() {
    let fast = |experts| LoadOptions {
        precision: Precision::Fast,
        experts,
        keep_blocks: false,
    };
    check("qwen3_moe_bf16", fast(PackedFormat::Bf16), 1e-2);
    check("qwen2_moe", fast(PackedFormat::Int8 { group: None }), 1e-2);
}
