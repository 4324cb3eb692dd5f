//! `strata batch` on an accelerator: the continuous-batching scheduler with routed experts
//! on the hybrid executor (`--device hybrid`), or the whole model on the device (`--device
//! gpu`, several sequences per forward pass and the prefix cache copying rows in and out of
//! device caches), writes the CPU path's greedy completions. Needs an accelerator: runs when
//! `STRATA_GPU_TESTS=1` (CI installs Mesa's lavapipe and sets it), says so when skipped.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{Value, json};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("strata-device-batch-{}-{name}", std::process::id()))
}

/// A batch input file of greedy completions of `prompts`, `max_tokens` each.
fn requests(name: &str, prompts: &[String], max_tokens: usize) -> PathBuf {
    let input = tmp(name);
    let lines: String = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let body = json!({"model": "strata-tiny-moe", "prompt": p, "max_tokens": max_tokens, "temperature": 0});
            json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/completions", "body": body})
                .to_string()
                + "\n"
        })
        .collect();
    fs::write(&input, lines).unwrap();
    input
}

fn gpu_tests() -> bool {
    let on = std::env::var("STRATA_GPU_TESTS").as_deref() == Ok("1");
    if !on {
        eprintln!("skipping: STRATA_GPU_TESTS is not 1");
    }
    on
}

fn batch(input: &PathBuf, output: &PathBuf, extra: &[&str]) -> Output {
    let _ = fs::remove_file(output);
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "batch",
            "--max-batch",
            "3",
            "--step-tokens",
            "16",
            "--dtype",
            "f32",
        ])
        .args(["--input"])
        .arg(input)
        .arg("--output")
        .arg(output)
        .args(extra)
        .output()
        .unwrap()
}

/// `custom_id` -> completion text.
fn texts(output: &PathBuf) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = responses(output)
        .iter()
        .map(|r| {
            let text = r["response"]["body"]["choices"][0]["text"]
                .as_str()
                .unwrap();
            (r["custom_id"].as_str().unwrap().into(), text.into())
        })
        .collect();
    v.sort();
    v
}

fn responses(output: &PathBuf) -> Vec<Value> {
    fs::read_to_string(output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn hybrid_batch_writes_the_cpu_paths_greedy_completions() {
    if !gpu_tests() {
        return;
    }
    let prompts = [
        "Hello, how are you?",
        "Tell me a story about a dragon.",
        "What is",
        "1 2 3 4 5",
        "The capital of France is",
    ]
    .map(String::from);
    let input = requests("in.jsonl", &prompts, 10);
    let cpu_out = tmp("cpu.jsonl");
    let out = batch(&input, &cpu_out, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = texts(&cpu_out);
    assert_eq!(want.len(), 5);
    for policy in ["gpu-lru", "smoe"] {
        let hyb_out = tmp(&format!("{policy}.jsonl"));
        let out = batch(
            &input,
            &hyb_out,
            &[
                "--device",
                "hybrid",
                "--policy",
                policy,
                "--vram-budget",
                "4MiB",
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(err.contains(&format!("hybrid, policy {policy}: ")), "{err}");
        assert!(err.contains("fallbacks 0"), "{err}");
        assert_eq!(texts(&hyb_out), want, "{policy}");
    }
}

/// `--device gpu`: three sequences per forward pass (prompt chunks beside decodes), and the
/// later requests start from the earlier ones' shared prefix, copied from the prefix cache
/// into their device caches: the completions are the CPU f32 path's.
#[test]
fn gpu_batch_writes_the_cpu_paths_greedy_completions_and_reuses_prefixes() {
    if !gpu_tests() {
        return;
    }
    let system = "You are a helpful assistant. Answer the question below in a few words. ";
    let prompts: Vec<String> = [
        "What is",
        "Tell me a story about a dragon.",
        "1 2 3 4 5",
        "Hello",
    ]
    .iter()
    .map(|q| format!("{system}{q}"))
    .collect();
    let input = requests("gpu-in.jsonl", &prompts, 8);
    let cpu_out = tmp("gpu-cpu.jsonl");
    let out = batch(&input, &cpu_out, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gpu_out = tmp("gpu-gpu.jsonl");
    let out = batch(&input, &gpu_out, &["--device", "gpu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("device=\"gpu\""), "{err}");
    assert_eq!(texts(&gpu_out), texts(&cpu_out));
    let cached: u64 = responses(&gpu_out)
        .iter()
        .map(|r| {
            r["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert!(
        cached >= 16,
        "the later requests start from the cached system prompt: {cached}"
    );
}
