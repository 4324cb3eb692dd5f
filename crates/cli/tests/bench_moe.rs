//! `strata bench moe --crossover` on a GGUF format, run as a user runs it: one row per token
//! count, each path this CPU runs timed, the fastest the one with the least time, and the
//! engine's default among the timed paths.

use std::process::Command;

use serde_json::Value;

#[test]
fn ggml_crossover_times_every_path_and_names_the_default() {
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "bench",
            "moe",
            "--hidden",
            "256",
            "--inter",
            "256",
            "--experts",
            "4",
        ])
        .args([
            "--topk",
            "2",
            "--formats",
            "q4_k",
            "--tokens",
            "4",
            "--min-seconds",
            "0.01",
        ])
        .args(["--crossover", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    // The paths each instruction set runs (`GgmlPath::available`).
    let want: &[&str] = match doc["machine"]["selected_isa"].as_str().unwrap() {
        "avx512" | "amx" => &["row-dot", "int8-tiles", "bf16-tiles"],
        "avxvnni" => &["row-dot", "int8-tiles"],
        _ => &["row-dot"],
    };
    let rows = doc["crossover"].as_array().unwrap();
    let tokens: Vec<u64> = rows
        .iter()
        .map(|r| r["tokens_per_expert"].as_u64().unwrap())
        .collect();
    assert_eq!(tokens, [1, 2, 4, 8, 16, 32, 64, 128, 256]);
    for r in rows {
        assert_eq!(r["format"], "q4_k");
        let paths = r["paths"].as_array().unwrap();
        let names: Vec<&str> = paths.iter().map(|p| p["path"].as_str().unwrap()).collect();
        assert_eq!(names, want, "{r}");
        let secs: Vec<f64> = paths
            .iter()
            .map(|p| p["seconds"].as_f64().unwrap())
            .collect();
        assert!(secs.iter().all(|s| s.is_finite() && *s > 0.0), "{r}");
        let least = (0..secs.len())
            .min_by(|&a, &b| secs[a].total_cmp(&secs[b]))
            .unwrap();
        assert_eq!(r["fastest"], names[least], "{r}");
        assert!(names.contains(&r["default"].as_str().unwrap()), "{r}");
    }
}
