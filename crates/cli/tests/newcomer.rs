//! What a newcomer tripped on (issue #15), run as they ran it: piped output, typos,
//! options that do not apply, errors, the server's log, stdin prompts and `-n 0`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

fn run(args: &[&str]) -> Output {
    strata().args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails with exit status 2 and returns stderr.
fn fails(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "{}", stderr(o));
    stderr(o)
}

const GREEDY: [&str; 7] = [
    "generate",
    "--prompt",
    "The capital of France is",
    "--temperature",
    "0",
    "-n",
    "8",
];

/// `strata generate ... | cat`: stdout holds the generated text and nothing else; the
/// load's progress and the statistics, with the load time, go to stderr.
#[test]
fn piped_generate_prints_only_the_text_on_stdout() {
    let o = run(&GREEDY);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(!out.contains('\x1b') && !out.contains("loading") && !out.contains("tok/s"));
    assert_eq!(out.lines().count(), 1, "{out:?}");
    assert!(err.contains("loading strata-tiny-moe: 6/6 layers"), "{err}");
    let stats = err.lines().last().unwrap();
    assert!(
        stats.starts_with("[load ") && stats.contains("tok/s"),
        "{err}"
    );
    assert!(!err.contains('\x1b'), "{err:?}");
}

/// `--prompt -` reads the prompt from stdin (less its final newline).
#[test]
fn prompt_dash_reads_stdin() {
    let want = run(&GREEDY);
    assert!(want.status.success(), "{}", stderr(&want));
    let mut args = GREEDY;
    args[2] = "-";
    let mut child = strata()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"The capital of France is\n").unwrap();
    drop(stdin);
    let got = child.wait_with_output().unwrap();
    assert!(got.status.success(), "{}", stderr(&got));
    assert_eq!(got.stdout, want.stdout);
}

/// `-n 0` used to generate one token while the server refuses `max_tokens: 0`; both refuse
/// it now (the server's side: crates/server/tests/app.rs).
#[test]
fn zero_max_tokens_is_refused_like_the_server() {
    for flag in ["-n", "--max-tokens"] {
        let err = fails(&run(&["generate", "--prompt", "Hi", flag, "0"]));
        assert!(
            err.contains("max-tokens") && err.contains("at least 1"),
            "{err}"
        );
    }
}

/// A mistyped local path used to be fetched as a hub id and fail with a DNS error three
/// times over.
#[test]
fn mistyped_local_path_is_not_taken_for_a_hub_id() {
    for model in ["models/strata-tiny", "./models/strata-tiny"] {
        let o = strata()
            .args(["info", "--model", model])
            .current_dir(root())
            .env("HF_ENDPOINT", "http://127.0.0.1:9")
            .output()
            .unwrap();
        let err = fails(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("no such model directory or file")
                && err.contains("strata-tiny-moe")
                && !err.contains("hub"),
            "{err}"
        );
    }
}

/// A cause that its error already prints used to be printed again
/// (`Address already in use (os error 98): Address already in use (os error 98)`).
#[test]
fn error_causes_are_printed_once() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let err = fails(&run(&["serve", "--port", &port]));
    let last = err.lines().last().unwrap();
    assert!(last.starts_with("error: serving on 127.0.0.1"), "{err}");
    assert_eq!(last.matches("in use").count(), 1, "{err}");
}

/// Each subcommand shows and accepts only the options that apply to it.
#[test]
fn options_apply_only_where_they_do() {
    let help = |cmd: &str| String::from_utf8(run(&[cmd, "--help"]).stdout).unwrap();
    for cmd in ["info", "convert", "trace", "stratify"] {
        let h = help(cmd);
        for flag in ["--device", "--policy", "--defer", "--hardware", "--profile"] {
            assert!(!h.contains(flag), "{cmd} --help lists {flag}");
        }
    }
    for cmd in ["generate", "logits", "serve", "batch"] {
        let h = help(cmd);
        assert!(
            h.contains("--policy") && h.contains("Hybrid execution"),
            "{cmd}"
        );
    }
    let err = fails(&run(&["info", "--policy", "fiddler"]));
    assert!(err.contains("--policy"), "{err}");
    let err = fails(&run(&["generate", "--prompt", "Hi", "--policy", "fiddler"]));
    assert!(
        err.contains("--policy applies only with --device hybrid"),
        "{err}"
    );
    let err = fails(&run(&[
        "generate", "--prompt", "Hi", "--device", "hybrid", "--policy", "smoe", "--defer", "2",
    ]));
    assert!(
        err.contains("expert deferral (defer 2) applies only with policy ktransformers, not smoe"),
        "{err}"
    );
    let err = fails(&run(&["generate", "--prompt", "Hi", "--vram-budget", "1G"]));
    assert!(err.contains("--vram-budget"), "{err}");
    let err = fails(&run(&[
        "generate",
        "--prompt",
        "Hi",
        "--device",
        "gpu",
        "--expert-cache",
        "1G",
    ]));
    assert!(err.contains("--device gpu holds every expert"), "{err}");
}

/// Mesa's device-select layer made libwayland print `error: XDG_RUNTIME_DIR is invalid`
/// on a successful `strata devices` where the variable is unset.
#[test]
fn devices_prints_no_wayland_error() {
    let o = strata()
        .arg("devices")
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("XDG_RUNTIME_DIR"), "{}", stderr(&o));
}

/// `strata devices` starts with the CPU: the kernel path it runs (as `STRATA_KERNEL` forces
/// it), the units that path multiplies on, and the memory available.
#[test]
fn devices_describes_the_cpu_path() {
    let o = strata()
        .args(["devices", "--json"])
        .env("STRATA_KERNEL", "portable")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let cpu = &doc["cpu"];
    assert_eq!(cpu["kernels"], "portable", "{doc}");
    assert_eq!(cpu["int8_unit"], "portable Rust", "{doc}");
    assert!(cpu["threads"].as_u64().is_some_and(|t| t >= 1), "{doc}");
    let available = cpu["available"].as_array().unwrap();
    assert!(available.iter().any(|v| v == "portable"), "{doc}");
    let text = strata().arg("devices").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.starts_with("cpu  "), "{text}");
    assert!(
        text.contains("\n  kernels ") && text.contains("\n  memory "),
        "{text}"
    );
}

/// Sends one HTTP/1.1 request and returns the whole response.
fn http(port: u16, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The server's log is plain text when it is not a terminal, one line per request with
/// its method, path, status, tokens and duration; a stream is logged when it ends.
#[test]
fn server_logs_one_plain_line_per_request() {
    let mut child = strata()
        .args(["serve", "--port", "0", "--ctx-size", "256"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let port = loop {
        let mut line = String::new();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "no listening line in {seen}"
        );
        seen += &line;
        if let Some(addr) = line.split("local=").nth(1) {
            let port = addr.split_whitespace().next().unwrap().rsplit(':').next();
            break port.unwrap().parse::<u16>().unwrap();
        }
    };
    let body = r#"{"model": "strata-tiny-moe", "prompt": "Once upon a time", "max_tokens": 5,
                  "temperature": 0}"#;
    assert!(http(port, "POST", "/v1/completions", body).starts_with("HTTP/1.1 200"));
    let stream = body.replace("\"temperature\"", "\"stream\": true, \"temperature\"");
    assert!(http(port, "POST", "/v1/completions", &stream).contains("[DONE]"));
    assert!(http(port, "GET", "/health", "").starts_with("HTTP/1.1 200"));
    assert!(http(port, "GET", "/nothing", "").starts_with("HTTP/1.1 404"));
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    log.read_to_string(&mut seen).unwrap();
    assert!(child.wait().unwrap().success(), "{seen}");
    assert!(!seen.contains('\x1b'), "{seen:?}");
    let requests: Vec<&str> = seen.lines().filter(|l| l.contains(" ms")).collect();
    assert_eq!(requests.len(), 4, "{seen}");
    let generated = "POST /v1/completions 200 prompt_tokens=";
    for line in &requests[..2] {
        assert!(line.contains(generated), "{seen}");
        assert!(line.contains("completion_tokens=5 "), "{seen}");
    }
    assert!(requests[2].contains("GET /health 200 "), "{seen}");
    assert!(requests[3].contains("GET /nothing 404 "), "{seen}");
}

/// `simulate --reproduce` says how far from the paper is acceptable, and which rows are.
#[test]
fn reproductions_show_their_tolerance_and_verdicts() {
    let o = run(&["simulate", "--reproduce", "ktransformers"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8(o.stdout).unwrap();
    let header = table.lines().next().unwrap();
    assert!(
        header.contains("paper") && header.contains("±25%"),
        "{table}"
    );
    let verdicts: Vec<&str> = table
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|v| ["pass", "fail"].contains(v))
        .collect();
    assert!(!verdicts.is_empty(), "{table}");
    let summary = table.lines().last().unwrap();
    assert!(
        summary.starts_with(&format!(
            "{} of {} values",
            verdicts.iter().filter(|v| **v == "pass").count(),
            verdicts.len()
        )),
        "{table}"
    );
    let o = run(&["simulate", "--reproduce", "ktransformers", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["tolerance"], 0.25);
    let rows = doc["rows"].as_array().unwrap();
    for row in rows {
        assert_eq!(
            row["agrees"].is_boolean(),
            row["paper"].is_number(),
            "{row}"
        );
    }
}

/// `simulate --expert-cache` replays the SSD tier: a bigger cache reads less per decoded
/// token; hardware without a drive is refused by name.
#[test]
fn simulate_runs_the_ssd_tier() {
    let sim = |cache: &str| {
        let o = run(&[
            "simulate",
            "--hardware",
            "local",
            "--model",
            "qwen3-30b-a3b",
            "--workload",
            "synthetic",
            "--prompt-tokens",
            "16",
            "--decode-tokens",
            "8",
            "--expert-cache",
            cache,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let (small, big) = (sim("200M"), sim("8G"));
    let per_token = |d: &serde_json::Value| d["decode"]["bytes_read"].as_f64().unwrap();
    assert!(per_token(&small) > per_token(&big), "{small} {big}");
    assert!(
        small["decode"]["tokens_per_s"].as_f64().unwrap() > 0.0,
        "{small}"
    );
    let o = run(&[
        "simulate",
        "--hardware",
        "smoe-4090",
        "--model",
        "qwen3-30b-a3b",
        "--expert-cache",
        "8G",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no `ssd`"), "{}", stderr(&o));
    let o = run(&[
        "simulate",
        "--model",
        "qwen3-30b-a3b",
        "--expert-cache",
        "8G",
        "--expert-cache-pin",
        "/no/such.trace",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/no/such.trace"), "{}", stderr(&o));
}

/// `trace` reports its progress on stderr, a plain line when stderr is not a terminal.
#[test]
fn trace_reports_progress_on_stderr() {
    let dir = std::env::temp_dir().join(format!("strata-newcomer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.txt");
    std::fs::write(&prompts, "Hello there\nThe sea is\n").unwrap();
    let out = dir.join("trace.jsonl");
    let o = run(&[
        "trace",
        "--prompts",
        prompts.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--decode",
        "2",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("tracing: 2/2 prompts"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
