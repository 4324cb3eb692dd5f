//! `strata batch --device hybrid`: the continuous-batching scheduler with routed experts on
//! the hybrid executor writes the CPU path's greedy completions; `--device gpu` is refused.
//! The hybrid run needs an accelerator and runs when `STRATA_GPU_TESTS=1` (CI installs
//! Mesa's lavapipe and sets it).

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{Value, json};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("strata-hybrid-batch-{}-{name}", std::process::id()))
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
    let mut v: Vec<(String, String)> = fs::read_to_string(output)
        .unwrap()
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            let text = r["response"]["body"]["choices"][0]["text"]
                .as_str()
                .unwrap();
            (r["custom_id"].as_str().unwrap().into(), text.into())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn hybrid_batch_writes_the_cpu_paths_greedy_completions() {
    let input = tmp("in.jsonl");
    let lines: String = [
        "Hello, how are you?",
        "Tell me a story about a dragon.",
        "What is",
        "1 2 3 4 5",
        "The capital of France is",
    ]
    .iter()
    .enumerate()
    .map(|(i, p)| {
        let body = json!({"model": "strata-tiny-moe", "prompt": p, "max_tokens": 10, "temperature": 0});
        json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/completions", "body": body})
            .to_string()
            + "\n"
    })
    .collect();
    fs::write(&input, lines).unwrap();

    let refused = batch(&input, &tmp("gpu.jsonl"), &["--device", "gpu"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(err.contains("serve and batch take cpu or hybrid"), "{err}");

    if std::env::var("STRATA_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipping the hybrid run: STRATA_GPU_TESTS is not 1");
        return;
    }
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
