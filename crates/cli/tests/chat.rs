//! `strata chat` (issue #15) with piped stdin, on the shipped model: greedy replies equal
//! `strata generate --chat`'s, the conversation is kept and cleared, `/system` and `/set`
//! take effect, bad settings are refused without ending the chat, multi-line input, end of
//! input and `/bye` end it cleanly, and Ctrl-C stops a reply but not the program.

use std::io::{Read, Write};
use std::process::{Child, Command, Output, Stdio};

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn spawn_chat(args: &[&str]) -> Child {
    strata()
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `strata chat ARGS` with `input` on stdin; it must exit successfully.
fn chat(args: &[&str], input: &str) -> Output {
    let mut child = spawn_chat(args);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

/// What `strata generate --chat MESSAGE` prints, greedy, `n` tokens at most.
fn generate(message: &str, system: Option<&str>, n: &str) -> String {
    let mut cmd = strata();
    cmd.args(["generate", "--chat", message, "--temperature", "0", "-n", n]);
    if let Some(s) = system {
        cmd.args(["--system", s]);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

const GREEDY: [&str; 4] = ["--temperature", "0", "-n", "12"];

/// Two turns: the first reply is `generate --chat`'s; the second continues the kept
/// conversation from the cache (`/stats` shows the reused prefix).
#[test]
fn two_turns_keep_the_conversation() {
    let first = generate("Hello", None, "12");
    let o = chat(&GREEDY, "Hello\nWhat is your name?\n/stats\n/bye\n");
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    let err = stderr(&o);
    assert!(out.starts_with(&first), "{out:?} vs {first:?}");
    assert!(out.len() > first.len() + 1, "no second reply: {out:?}");
    assert!(err.contains("conversation: 4 messages"), "{err}");
    let reused: usize = err
        .split("tokens (")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no reuse count in {err}"));
    assert!(
        reused > 0,
        "the second turn ran the whole conversation again: {err}"
    );
}

/// `/clear` forgets the conversation and `/system` sets the system message: the same
/// question gets `generate`'s replies with and without `--system`. End of input ends the
/// chat without `/bye`.
#[test]
fn clear_and_system_change_the_conversation() {
    let plain = generate("Hello", None, "12");
    let pirate = generate("Hello", Some("Answer like a pirate."), "12");
    let input = "Hello\n/clear\nHello\n/clear\n/system Answer like a pirate.\nHello\n";
    let o = chat(&GREEDY, input);
    let err = stderr(&o);
    assert_eq!(
        String::from_utf8(o.stdout).unwrap(),
        format!("{plain}{plain}{pirate}")
    );
    assert!(err.contains("[conversation cleared]") && err.contains("[system message set]"));
}

/// `/set` changes sampling and the reply length; a bad value is an error that leaves the
/// settings as they were.
#[test]
fn set_changes_the_settings_and_refuses_bad_values() {
    let short = generate("Hello", None, "3");
    let input = "/set temperature 0\n/set max_tokens 3\n/set temperature -1\n/set top_p abc\n\
                 /set warmth 1\n/set max_tokens 0\nHello\n/stats\n/bye\n";
    let o = chat(&["--temperature", "0.9", "--seed", "5"], input);
    let err = stderr(&o);
    assert_eq!(String::from_utf8(o.stdout).unwrap(), short, "{err}");
    assert_eq!(err.matches("error: ").count(), 4, "{err}");
    assert!(err.contains("unknown setting \"warmth\""), "{err}");
    assert!(err.contains("last reply: 3 tokens at"), "{err}");
    assert!(err.contains("settings: temperature 0, top_p 0.95"), "{err}");
    assert!(err.contains("max_tokens 3"), "{err}");
}

/// A `"""` block and lines ending in `\` make one message of several lines.
#[test]
fn multi_line_input_is_one_message() {
    let want = generate("Write a poem\nabout the sea", None, "12");
    let input = "\"\"\"Write a poem\nabout the sea\"\"\"\n/clear\n\"\"\"\nWrite a poem\nabout the sea\n\"\"\"\n\
                 /clear\nWrite a poem\\\nabout the sea\n/bye\n";
    let o = chat(&GREEDY, input);
    let err = stderr(&o);
    assert_eq!(
        String::from_utf8(o.stdout).unwrap(),
        want.repeat(3),
        "{err}"
    );
}

/// Ctrl-C (SIGINT) while a reply streams stops the reply; the chat goes on and `/bye`
/// ends it with success.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_reply_not_the_program() {
    // Greedy, the shipped model repeats itself to the length limit: a long reply.
    let mut child = spawn_chat(&["--temperature", "0", "-n", "1000"]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Hello\n").unwrap();
    stdin.flush().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    let n = stdout.read(&mut first).unwrap();
    assert!(n > 0, "no reply streamed");
    // The shell's own `kill` (a builtin: no procps needed).
    let kill = Command::new("sh")
        .args(["-c", &format!("kill -INT {}", child.id())])
        .status()
        .expect("running sh");
    assert!(kill.success());
    stdin.write_all(b"/stats\n/bye\n").unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("[reply stopped]"), "{err}");
    let generated: usize = err
        .split("last reply: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no /stats in {err}"));
    assert!(generated < 1000, "the reply ran to its end: {err}");
    assert!(err.contains("finish: stopped"), "{err}");
}
