//! A closed stdout (`strata simulate | head`) ends a command quietly with status 0, as for
//! any Unix filter, instead of a panic from `println!` (issue #15).

use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `strata args` with stdout a pipe whose reader is closed before the command starts,
/// so its first write fails with EPIPE whatever the timing.
fn into_closed_pipe(args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn commands_end_quietly_when_stdout_is_closed() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_moe");
    let fixture = fixture.to_str().unwrap();
    let commands: [&[&str]; 5] = [
        &["simulate", "--decode-tokens", "4"],
        &["simulate", "--reproduce", "ktransformers"],
        &["info", "--model", fixture],
        &["info", "--model", fixture, "--json"],
        &[
            "generate",
            "-p",
            "Once upon",
            "-n",
            "4",
            "--temperature",
            "0",
        ],
    ];
    for args in commands {
        let o = into_closed_pipe(args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && !stderr.contains("panicked"),
            "strata {}: {:?}\n{stderr}",
            args.join(" "),
            o.status
        );
    }
}
