//! The command-line contract, run as a user runs it: `strata logits` against the reference
//! logits at every chunking, `strata info` on every fixture, `strata generate` on the
//! shipped model, and clear errors for bad arguments.

use std::path::{Path, PathBuf};
use std::process::Command;

use strata_formats::npy;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn strata(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .unwrap()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("strata-cli-{}-{name}", std::process::id()))
}

#[test]
fn logits_match_reference_at_every_chunking() {
    for name in ["deepseek_v3", "qwen3_moe", "glm4_moe"] {
        let dir = root().join("tests/fixtures").join(name);
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let tokens: Vec<String> = reference["sequences"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.to_string())
            .collect();
        let want = npy::read_f32(&dir.join("logits_0.npy")).unwrap();
        let max_ref = want.data.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for chunk in [None, Some("1"), Some("5")] {
            let out = tmp(&format!("{name}-{}.npy", chunk.unwrap_or("all")));
            let tokens = tokens.join(",");
            let mut args = vec![
                "logits",
                "--model",
                dir.to_str().unwrap(),
                "--tokens",
                &tokens,
                "--out",
                out.to_str().unwrap(),
                "--dtype",
                "f32",
            ];
            if let Some(c) = chunk {
                args.extend(["--chunk", c]);
            }
            let o = strata(&args);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let got = npy::read_f32(&out).unwrap();
            assert_eq!(got.shape, want.shape);
            let err = got
                .data
                .iter()
                .zip(&want.data)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= 1e-3 * max_ref,
                "{name} chunk {chunk:?}: error {err} vs max {max_ref}"
            );
            std::fs::remove_file(&out).unwrap();
        }
    }
}

#[test]
fn info_describes_every_fixture() {
    for entry in std::fs::read_dir(root().join("tests/fixtures")).unwrap() {
        let dir = entry.unwrap().path();
        let o = strata(&["info", "--model", dir.to_str().unwrap(), "--json"]);
        assert!(
            o.status.success(),
            "{}: {}",
            dir.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let total = doc["parameters"]["total"].as_u64().unwrap();
        let active = doc["parameters"]["active_per_token"].as_u64().unwrap();
        assert!(active <= total && active > 0, "{}: {doc}", dir.display());
    }
}

/// A GGUF type the GPU kernels do not read is reported as widened to F16 there, with its
/// size; one they read is not.
#[test]
fn info_says_which_types_a_gpu_widens_to_f16() {
    let dir = root().join("tests/fixtures-gguf");
    let doc = |name: &str| -> serde_json::Value {
        let path = dir.join(format!("qwen3_moe_k.{name}.gguf"));
        let o = strata(&["info", "--model", path.to_str().unwrap(), "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let q3 = doc("q3_k");
    let widened = &q3["device_f16_types"][0];
    assert_eq!(widened["type"], "Q3_K", "{q3}");
    let (bytes, f16) = (
        widened["bytes"].as_u64().unwrap(),
        widened["f16_bytes"].as_u64().unwrap(),
    );
    // Q3_K holds 3.4375 bits per weight; F16 16.
    assert!(f16 * 110 == bytes * 512, "{bytes} -> {f16}");
    assert_eq!(doc("q4_k")["device_f16_types"], serde_json::json!([]));
}

#[test]
fn generate_reproduces_the_reference_continuation() {
    // Greedy decoding of the shipped model continues its first reference prompt as
    // transformers does (models/strata-tiny-moe/reference/reference.json).
    let o = strata(&[
        "generate",
        "--chat",
        "How do I sort a list in Python?",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.starts_with("Sure, here's an example of how you can use"),
        "{text}"
    );
    let stats = String::from_utf8(o.stderr).unwrap();
    assert!(stats.contains("tok/s"), "{stats}");
}

#[test]
fn stop_string_ends_generation() {
    let o = strata(&[
        "generate",
        "--chat",
        "How do I sort a list in Python?",
        "--temperature",
        "0",
        "--stop",
        "example",
    ]);
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8(o.stdout).unwrap().trim_end(),
        "Sure, here's an"
    );
}

#[test]
fn bad_arguments_are_clear_errors() {
    let o = strata(&["logits", "--tokens", "1,x", "--out", "/tmp/never.npy"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("item 2"));
    let o = strata(&["info", "--model", "/nonexistent/model"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/model"));
    let o = strata(&["generate", "--chat", "hi", "--temperature", "-1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("temperature"));
}

/// A hub id resolves through the Hugging Face cache layout (`HF_HOME/hub/models--org--name`)
/// without a network; an id that is neither cached nor reachable is a clear error.
#[test]
fn hub_ids_use_the_cache_and_fail_clearly() {
    let home = tmp("hf-home");
    let repo = home.join("hub/models--strata--tiny-moe");
    let snap = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    let model = root().join("models/strata-tiny-moe");
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ] {
        std::os::unix::fs::symlink(model.join(f), snap.join(f)).unwrap();
    }
    let run = |id: &str| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["info", "--model", id])
            .env("HF_HOME", &home)
            .env("HF_ENDPOINT", "http://127.0.0.1:9")
            .env_remove("HF_TOKEN")
            .output()
            .unwrap()
    };
    let o = run("strata/tiny-moe");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Qwen3MoeForCausalLM"));
    let o = run("nobody/nothing");
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("nobody/nothing") && err.contains("Hugging Face hub"),
        "{err}"
    );
    std::fs::remove_dir_all(&home).unwrap();
}

/// `--device gpu` equals the CPU f32 path (prefill and `--chunk 1`) and generates the same
/// greedy text. Runs when `STRATA_GPU_TESTS=1` (CI installs Mesa's lavapipe and sets it).
#[test]
fn gpu_device_matches_cpu() {
    if std::env::var("STRATA_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipping: STRATA_GPU_TESTS is not 1");
        return;
    }
    for name in ["qwen3_moe", "deepseek_v3", "glm4_moe"] {
        let dir = root().join("tests/fixtures").join(name);
        let dir = dir.to_str().unwrap();
        let cpu = tmp(&format!("{name}-cpu.npy"));
        let o = strata(&[
            "logits",
            "--model",
            dir,
            "--tokens",
            "3,1,4,1,5,9,2,6",
            "--out",
            cpu.to_str().unwrap(),
            "--dtype",
            "f32",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let want = npy::read_f32(&cpu).unwrap();
        let max_ref = want.data.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for chunk in ["8", "1"] {
            let gpu = tmp(&format!("{name}-gpu-{chunk}.npy"));
            let o = strata(&[
                "logits",
                "--model",
                dir,
                "--tokens",
                "3,1,4,1,5,9,2,6",
                "--out",
                gpu.to_str().unwrap(),
                "--device",
                "gpu",
                "--chunk",
                chunk,
            ]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let got = npy::read_f32(&gpu).unwrap();
            let err = got
                .data
                .iter()
                .zip(&want.data)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= 1e-3 * max_ref,
                "{name} chunk {chunk}: gpu error {err} vs max {max_ref}"
            );
            std::fs::remove_file(&gpu).unwrap();
        }
        std::fs::remove_file(&cpu).unwrap();
    }
    let o = strata(&[
        "generate",
        "--device",
        "gpu",
        "--chat",
        "How do I sort a list in Python?",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.starts_with("Sure, here's an example of how you can use"),
        "{text}"
    );
    // The model's context (1,024 positions) ends the sequence on the accelerator as on the
    // CPU: about 990 prompt tokens leave room for fewer than the 64 asked for.
    let long = "the ".repeat(990);
    for device in ["cpu", "gpu"] {
        let o = strata(&[
            "generate",
            "--device",
            device,
            "-p",
            &long,
            "-n",
            "64",
            "--temperature",
            "0",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{device}: {err}");
        assert!(err.contains("finish: context full"), "{device}: {err}");
    }
}

/// The DRAM expert cache from the command line, its experts read through io_uring or on
/// threads, with a routing trace's hottest experts pinned (`--expert-cache-pin`): logits bit
/// for bit the mapped model's, the pinned experts read at start and said.
#[test]
fn expert_cache_with_pins_gives_the_mapped_models_logits() {
    let gguf = root().join("tests/fixtures-gguf/qwen3_moe_q32.q8_0.gguf");
    let gguf = gguf.to_str().unwrap();
    let prompts = tmp("pin-prompts.txt");
    let trace = tmp("pin.trace");
    std::fs::write(&prompts, "The capital of France\nSing a song of the sea\n").unwrap();
    let o = strata(&[
        "trace",
        "--model",
        gguf,
        "--prompts",
        prompts.to_str().unwrap(),
        "--out",
        trace.to_str().unwrap(),
        "--decode",
        "4",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trace = trace.to_str().unwrap();
    let mut logits = Vec::new();
    let runs: [(&[&str], &str); 3] = [
        (&["--expert-cache", "off"], "threads"),
        (
            &["--expert-cache", "300K", "--expert-cache-pin", trace],
            "io_uring",
        ),
        (
            &["--expert-cache", "300K", "--expert-cache-pin", trace],
            "threads",
        ),
    ];
    for (i, (cache, reads)) in runs.iter().enumerate() {
        let out = tmp(&format!("pins-{i}.npy"));
        let mut args = vec!["logits", "--model", gguf, "--tokens", "3,1,4,1,5,9,2,6"];
        args.extend(["--out", out.to_str().unwrap()]);
        args.extend(cache.iter());
        let o = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(&args)
            .env("STRATA_EXPERT_READS", reads)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        if i > 0 {
            assert!(err.contains("pinned experts ("), "{err}");
        }
        logits.push(npy::read_f32(&out).unwrap().data);
        std::fs::remove_file(&out).unwrap();
    }
    for other in &logits[1..] {
        let same = logits[0].iter().zip(other);
        assert!(same.clone().all(|(a, b)| a.to_bits() == b.to_bits()));
    }
    let args = [
        "generate",
        "--model",
        gguf,
        "-p",
        "The capital of",
        "-n",
        "4",
        "--expert-cache",
        "300K",
        "--expert-cache-pin",
        trace,
    ];
    let o = strata(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("pinned experts") && err.contains("at start"),
        "{err}"
    );
    let o = strata(&[
        "generate",
        "--model",
        gguf,
        "-p",
        "Hi",
        "--expert-cache",
        "off",
        "--expert-cache-pin",
        trace,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--expert-cache off"),
        "{err}"
    );
    std::fs::remove_file(trace).unwrap();
}

/// Three tiers from the command line: `--device hybrid --policy smoe --expert-cache SIZE`
/// (the device's expert cache above a DRAM cache of a few experts above the GGUF) gives the
/// logits of the same run over the mapped file bit for bit, and `generate` says what went
/// to the device through the DRAM cache. Runs when `STRATA_GPU_TESTS=1`.
#[test]
fn three_tiers_from_the_command_line() {
    if std::env::var("STRATA_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipping: STRATA_GPU_TESTS is not 1");
        return;
    }
    let gguf = root().join("tests/fixtures-gguf/qwen3_moe_q32.q8_0.gguf");
    let gguf = gguf.to_str().unwrap();
    let hybrid = [
        "--device",
        "hybrid",
        "--policy",
        "smoe",
        "--vram-budget",
        "64K",
    ];
    let mut logits = Vec::new();
    for cache in ["off", "200K"] {
        let out = tmp(&format!("three-tiers-{cache}.npy"));
        let mut args = vec!["logits", "--model", gguf, "--tokens", "3,1,4,1,5,9,2,6"];
        args.extend(["--out", out.to_str().unwrap(), "--expert-cache", cache]);
        args.extend(hybrid);
        let o = strata(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        logits.push(npy::read_f32(&out).unwrap().data);
        std::fs::remove_file(&out).unwrap();
    }
    let same = logits[0].iter().zip(&logits[1]);
    assert!(same.clone().all(|(a, b)| a.to_bits() == b.to_bits()));
    let mut args = vec![
        "generate",
        "--model",
        gguf,
        "-p",
        "The capital of",
        "-n",
        "8",
    ];
    args.extend(["--expert-cache", "200K"]);
    args.extend(hybrid);
    let o = strata(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("[expert cache: "), "{err}");
    assert!(err.contains("experts copied to the accelerator"), "{err}");
    assert!(err.contains("[hybrid, policy smoe"), "{err}");
}

/// `--device hybrid` (attention on the device with its F16 KV cache, routed experts placed
/// by the policy) equals the CPU f32 path within 1e-3 x max|ref|, as `--device gpu` does,
/// under every policy, with a budget small enough to evict and stage, prefill and token by
/// token; `generate` prints the executor's statistics. Runs when `STRATA_GPU_TESTS=1`.
#[test]
fn hybrid_device_matches_cpu_under_every_policy() {
    if std::env::var("STRATA_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipping: STRATA_GPU_TESTS is not 1");
        return;
    }
    let dir = root().join("tests/fixtures/qwen3_moe");
    let dir = dir.to_str().unwrap();
    let tokens = "3,1,4,1,5,9,2,6";
    let cpu = tmp("hybrid-cpu.npy");
    let o = strata(&[
        "logits",
        "--model",
        dir,
        "--tokens",
        tokens,
        "--out",
        cpu.to_str().unwrap(),
        "--dtype",
        "f32",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = npy::read_f32(&cpu).unwrap();
    let max_ref = want.data.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for policy in ["gpu-lru", "fiddler", "ktransformers", "hybrimoe", "smoe"] {
        for chunk in ["8", "1"] {
            let out = tmp(&format!("hybrid-{policy}-{chunk}.npy"));
            let o = strata(&[
                "logits",
                "--model",
                dir,
                "--tokens",
                tokens,
                "--out",
                out.to_str().unwrap(),
                "--dtype",
                "f32",
                "--device",
                "hybrid",
                "--policy",
                policy,
                "--vram-budget",
                "60K",
                "--chunk",
                chunk,
            ]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{err}");
            assert!(err.contains(&format!("[hybrid, policy {policy}")), "{err}");
            let got = npy::read_f32(&out).unwrap();
            let diff = got
                .data
                .iter()
                .zip(&want.data)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= 1e-3 * max_ref,
                "{policy} chunk {chunk}: error {diff} vs max {max_ref}"
            );
            std::fs::remove_file(&out).unwrap();
        }
    }
    std::fs::remove_file(&cpu).unwrap();
    let o = strata(&[
        "generate",
        "--device",
        "hybrid",
        "--policy",
        "ktransformers",
        "--defer",
        "1",
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0",
        "--max-tokens",
        "6",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("policy ktransformers-defer1") && err.contains("deferred"),
        "{err}"
    );
    // A recorded trace pins Fiddler's experts and trains SMoE's predictors.
    let prompts = tmp("hybrid-prompts.txt");
    let trace = tmp("hybrid.trace");
    std::fs::write(
        &prompts,
        "Write a poem about the sea\nHow do engines work?\n",
    )
    .unwrap();
    let o = strata(&[
        "trace",
        "--prompts",
        prompts.to_str().unwrap(),
        "--out",
        trace.to_str().unwrap(),
        "--decode",
        "8",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for policy in ["fiddler", "smoe"] {
        let o = strata(&[
            "generate",
            "--device",
            "hybrid",
            "--policy",
            policy,
            "--profile",
            trace.to_str().unwrap(),
            "--vram-budget",
            "4MiB",
            "--prompt",
            "The capital of France is",
            "--temperature",
            "0",
            "--max-tokens",
            "6",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains(&format!("[hybrid, policy {policy}")), "{err}");
    }
    std::fs::remove_file(&prompts).unwrap();
    std::fs::remove_file(&trace).unwrap();
}
