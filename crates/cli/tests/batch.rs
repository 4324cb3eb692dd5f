//! `strata batch` end to end: Batch API lines in and out, errors per line, resuming.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("strata-batch-{}-{name}", std::process::id()))
}

fn line(id: &str, url: &str, body: Value) -> String {
    json!({"custom_id": id, "method": "POST", "url": url, "body": body}).to_string() + "\n"
}

fn run(input: &PathBuf, output: &PathBuf) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["batch", "--max-batch", "4", "--input"])
        .arg(input)
        .arg("--output")
        .arg(output)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

fn results(output: &PathBuf) -> Vec<Value> {
    fs::read_to_string(output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn batch_runs_every_line_and_resumes() {
    let (input, output) = (tmp("in.jsonl"), tmp("out.jsonl"));
    let _ = fs::remove_file(&output);
    let model = "strata-tiny-moe";
    let chat = |c: &str| json!({"model": model, "messages": [{"role": "user", "content": c}], "max_tokens": 8});
    let mut text = line("a", "/v1/chat/completions", chat("Hello"));
    text += &line(
        "b",
        "/v1/completions",
        json!({"model": model, "prompt": "The sea", "max_tokens": 8}),
    );
    text += &line(
        "bad",
        "/v1/chat/completions",
        json!({"model": model, "messages": [], "temperature": -1}),
    );
    fs::write(&input, &text).unwrap();
    let stderr = run(&input, &output);
    assert!(stderr.contains("done: 3 requests (1 failed)"), "{stderr}");
    let got = results(&output);
    assert_eq!(got.len(), 3);
    for r in &got {
        let status = &r["response"]["status_code"];
        match r["custom_id"].as_str().unwrap() {
            "bad" => assert_eq!(status, 400, "{r}"),
            _ => {
                assert_eq!(status, 200, "{r}");
                assert!(r["response"]["body"]["usage"]["completion_tokens"].as_u64() > Some(0));
            }
        }
    }

    // An interrupted run left a partial line; a new request was added.
    let mut partial = fs::read_to_string(&output).unwrap();
    partial += "{\"custom_id\": \"c\", \"resp";
    fs::write(&output, partial).unwrap();
    text += &line("c", "/v1/chat/completions", chat("Again"));
    fs::write(&input, &text).unwrap();
    let stderr = run(&input, &output);
    assert!(stderr.contains("1 requests to run, 3 already"), "{stderr}");
    let ids: BTreeSet<String> = results(&output)
        .iter()
        .map(|r| r["custom_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["a", "b", "bad", "c"].map(String::from).into());
    assert_eq!(results(&output).len(), 4);
    let _ = fs::remove_file(&input);
    let _ = fs::remove_file(&output);
}

#[test]
fn a_batch_whose_kv_cache_cannot_fit_is_refused_before_it_starts() {
    let input = tmp("huge.jsonl");
    let output = tmp("huge-out.jsonl");
    let body = json!({"model": "m", "prompt": "hi", "max_tokens": 2});
    fs::write(&input, line("a", "/v1/completions", body)).unwrap();
    let _ = fs::remove_file(&output);
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["batch", "--max-batch", "1000000000", "--ctx-size", "64"])
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("not enough memory"), "{stderr}");
    assert!(
        stderr.contains("lower --ctx-size, --max-batch or --prefix-cache-mb"),
        "{stderr}"
    );
    let written = fs::read_to_string(&output).unwrap_or_default();
    assert!(
        written.is_empty(),
        "a refused batch writes no result: {written}"
    );
}
