//! `strata convert` as a user runs it: the converted model generates and scores exactly as
//! its source does, carries its tokenizer, and failures leave nothing behind.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn strata(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = strata(args);
    assert!(
        o.status.success(),
        "strata {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn fail(args: &[&str]) -> String {
    let o = strata(args);
    assert!(!o.status.success(), "strata {args:?} should fail");
    String::from_utf8(o.stderr).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-cli-convert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn converted_tiny_model_generates_what_its_source_generates() {
    let src = root().join("models/strata-tiny-moe");
    let src = src.to_str().unwrap();
    let out = tmp("tiny");
    let out_s = out.to_str().unwrap();
    let said = ok(&[
        "convert",
        "--model",
        src,
        "--out",
        out_s,
        "--weights",
        "int8",
    ]);
    assert!(said.contains("model.strata"), "{said}");
    assert!(out.join("model.strata").is_file());
    let gen_args = |m: &str| {
        ok(&[
            "generate",
            "--model",
            m,
            "--weights",
            "int8",
            "--chat",
            "What is the weather like?",
            "--max-tokens",
            "12",
            "--temperature",
            "0",
        ])
    };
    // The chat template and tokenizer come from inside the converted file.
    assert_eq!(gen_args(out_s), gen_args(src));
    let info = ok(&["info", "--model", out_s]);
    assert!(info.contains("packed int8"), "{info}");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn converted_gguf_scores_bit_identically() {
    let src = root().join("tests/fixtures-gguf/qwen3_moe_normed.gguf");
    let src = src.to_str().unwrap();
    let conv = tmp("qwen3.strata");
    let conv_s = conv.to_str().unwrap();
    ok(&["convert", "--model", src, "--out", conv_s]);
    let logits = |m: &str, name: &str| {
        let out = tmp(name);
        ok(&[
            "logits",
            "--model",
            m,
            "--tokens",
            "1,5,9,2,7,3",
            "--out",
            out.to_str().unwrap(),
        ]);
        std::fs::read(out).unwrap()
    };
    assert_eq!(logits(conv_s, "a.npy"), logits(src, "b.npy"));
    let e = fail(&[
        "convert",
        "--model",
        conv_s,
        "--out",
        tmp("again").to_str().unwrap(),
    ]);
    assert!(e.contains("already a converted model"), "{e}");
}

#[test]
fn failures_are_clear_and_leave_nothing_behind() {
    let src = root().join("tests/fixtures/qwen3_moe");
    let missing = tmp("no-such-dir/sub/x.strata");
    let e = fail(&[
        "convert",
        "--model",
        src.to_str().unwrap(),
        "--out",
        missing.to_str().unwrap(),
    ]);
    assert!(e.contains("x.strata"), "{e}");
    assert!(!missing.exists() && !missing.with_extension("strata.tmp").exists());
    let e = fail(&[
        "convert",
        "--model",
        src.to_str().unwrap(),
        "--out",
        tmp("gpu.strata").to_str().unwrap(),
        "--device",
        "gpu",
    ]);
    assert!(e.contains("--device"), "{e}");
    // A directory made for the output is removed again when conversion fails.
    let made = tmp("made-for-nothing");
    let e = fail(&[
        "convert",
        "--model",
        tmp("no-such-model").to_str().unwrap(),
        "--out",
        made.to_str().unwrap(),
    ]);
    assert!(e.contains("no-such-model"), "{e}");
    let bad_src = tmp("bad-src");
    std::fs::create_dir_all(&bad_src).unwrap();
    std::fs::copy(src.join("config.json"), bad_src.join("config.json")).unwrap();
    let e = fail(&[
        "convert",
        "--model",
        bad_src.to_str().unwrap(),
        "--out",
        made.to_str().unwrap(),
    ]);
    assert!(e.contains("bad-src"), "{e}");
    assert!(!made.exists());
    let junk = tmp("junk.strata");
    std::fs::write(
        &junk,
        b"not a model at all, just some bytes here and more of them",
    )
    .unwrap();
    let e = fail(&["info", "--model", junk.to_str().unwrap()]);
    assert!(
        e.contains("junk.strata") && e.contains("not a .strata file"),
        "{e}"
    );
}

#[test]
fn converted_model_traces_stratifies_and_refuses_other_options() {
    let src = root().join("models/strata-tiny-moe");
    let src = src.to_str().unwrap();
    let canonical = Path::new(src).canonicalize().unwrap();
    let canonical = canonical.display();
    let out = tmp("tiny-int8.strata");
    let out_s = out.to_str().unwrap();
    ok(&[
        "convert",
        "--model",
        src,
        "--out",
        out_s,
        "--weights",
        "int8",
    ]);
    let prompts = tmp("prompts.txt");
    std::fs::write(
        &prompts,
        "Write a poem about the sea\nHow do engines work?\n{\"prompt\": \"Tell me a joke\"}\n\"What is rust?\"\n",
    )
    .unwrap();
    let p = prompts.to_str().unwrap();
    // The tokenizer and the expert count come from inside the converted file.
    let trace = tmp("tiny.trace");
    ok(&[
        "trace",
        "--model",
        out_s,
        "--prompts",
        p,
        "--out",
        trace.to_str().unwrap(),
        "--decode",
        "2",
    ]);
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.lines().count() > 4 * 6,
        "{} lines",
        text.lines().count()
    );
    let table = ok(&[
        "stratify",
        "--model",
        out_s,
        "--prompts",
        p,
        "--budget-experts",
        "24",
        "--clusters",
        "2",
        "--random-trials",
        "2",
        "--json",
    ]);
    assert!(table.trim_start().starts_with('{'), "{table}");
    // Options it was not converted with are an error naming what it holds and the fix.
    for asked in [
        &["--dtype", "f32"][..],
        &["--weights", "int4"],
        &["--dtype", "fast", "--weights", "bf16"],
    ] {
        let mut args = vec![
            "generate",
            "--model",
            out_s,
            "--prompt",
            "Hi",
            "--max-tokens",
            "1",
        ];
        args.extend_from_slice(asked);
        let e = fail(&args);
        assert!(
            e.contains("--dtype fast --weights int8")
                && e.contains(&asked.join(" "))
                && e.contains(&format!("strata convert --model {canonical}")),
            "{e}"
        );
    }
    // The options it holds, given explicitly, are fine.
    ok(&[
        "generate",
        "--model",
        out_s,
        "--prompt",
        "Hi",
        "--max-tokens",
        "1",
        "--dtype",
        "fast",
        "--weights",
        "int8",
    ]);
    for f in [&out, &prompts, &trace] {
        std::fs::remove_file(f).unwrap();
    }
}

/// `--device gpu` and `--device hybrid` on a converted model score as the CPU does on the
/// same file. Runs when `STRATA_GPU_TESTS=1` (CI installs Mesa's lavapipe and sets it).
#[test]
fn converted_model_runs_on_gpu_and_hybrid() {
    if std::env::var("STRATA_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipping: STRATA_GPU_TESTS is not 1");
        return;
    }
    let src = root().join("tests/fixtures/qwen3_moe");
    let conv = tmp("qwen3-f32.strata");
    let conv_s = conv.to_str().unwrap();
    ok(&[
        "convert",
        "--model",
        src.to_str().unwrap(),
        "--out",
        conv_s,
        "--dtype",
        "f32",
    ]);
    let logits = |device: &str| {
        let out = tmp(&format!("conv-{device}.npy"));
        ok(&[
            "logits",
            "--model",
            conv_s,
            "--tokens",
            "3,1,4,1,5,9,2,6",
            "--out",
            out.to_str().unwrap(),
            "--device",
            device,
        ]);
        let v = strata_formats::npy::read_f32(&out).unwrap().data;
        std::fs::remove_file(&out).unwrap();
        v
    };
    let want = logits("cpu");
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for device in ["gpu", "hybrid"] {
        let got = logits(device);
        assert_eq!(got.len(), want.len(), "{device}");
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-3 * max_ref,
            "{device}: error {err} vs max {max_ref}"
        );
    }
    std::fs::remove_file(&conv).unwrap();
}
