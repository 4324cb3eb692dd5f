//! The `strata` command line: `info`, `generate`, `chat`, `logits`, `serve`, `batch`, `trace`,
//! `simulate`, `stratify`, `devices`, `bench moe`, `convert`.
//!
//! Arguments are parsed by clap into raw values, then validated into the typed settings the
//! library crates take. Errors print with their whole cause chain and exit with status 2; a
//! closed stdout (`strata generate | head`) is not an error.

// A binary exports nothing, so this checks the crate doc above and any `pub` item of this
// file; the modules below are private.
#![deny(missing_docs)]

/// `println!` that returns the write's error instead of panicking on it: a closed pipe
/// (`strata simulate | head`) then ends the command quietly through `is_broken_pipe`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
    }};
}

/// `print!` that returns the write's error instead of panicking on it (see `outln!`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($arg)*)
    }};
}

mod batch;
mod bench;
mod bench_device;
mod bench_grammar;
mod chat;
mod convert;
mod devices;
mod generate;
mod hub;
mod info;
mod logits;
mod model_arg;
mod plot;
mod progress;
mod serve;
mod simulate;
mod stratify;
mod svg;
mod trace;

use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Strata runs Mixture-of-Experts language models on machines whose fast memory is too
/// small for the model.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show a model's architecture, parameters, experts, dtypes and memory footprint.
    Info(info::InfoArgs),
    /// Generate text from a prompt or a chat message, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Chat with a model interactively: the conversation is kept, replies stream, and
    /// slash commands (`/help`) change it.
    Chat(chat::ChatArgs),
    /// Write the logits at every position of a token sequence to a .npy file.
    Logits(logits::LogitsArgs),
    /// Benchmarks of Strata's kernels.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Serve the model over an OpenAI-compatible HTTP API with continuous batching.
    Serve(serve::ServeArgs),
    /// Run an OpenAI Batch API file (JSONL) through the continuous-batching scheduler.
    Batch(batch::BatchArgs),
    /// List the accelerators this build can use, with their limits and supported operations.
    Devices(devices::DevicesArgs),
    /// Record the routing of every token at every MoE layer into a routing trace.
    Trace(trace::TraceArgs),
    /// Simulate a placement policy on other hardware, or reproduce a seed's comparison.
    Simulate(simulate::SimulateArgs),
    /// Pick the experts to pin in VRAM from prototypes of a prompt set (CoX-MoE's
    /// expert-aware stratification) and report the hit ratio against random pinning.
    Stratify(stratify::StratifyArgs),
    /// Write a model in Strata's packed format (.strata), which later loads by mapping.
    Convert(convert::ConvertArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Time one MoE layer on the CPU kernels against the machine's measured peaks.
    Moe(bench::BenchMoeArgs),
    /// Time the accelerator's kernels on GGUF blocks against its measured copy bandwidth
    /// and arithmetic peak.
    Device(bench_device::BenchDeviceArgs),
    /// Time structured outputs: the grammar's cost per generated token at each batch size.
    Grammar(bench_grammar::BenchGrammarArgs),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info(a) => info::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Batch(a) => batch::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Bench(BenchCommand::Moe(a)) => bench::bench_moe(&a),
        Command::Bench(BenchCommand::Grammar(a)) => bench_grammar::run(a),
        Command::Bench(BenchCommand::Device(a)) => bench_device::run(a),
        Command::Devices(a) => devices::run(a),
        Command::Trace(a) => trace::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Stratify(a) => stratify::run(a),
        Command::Convert(a) => convert::run(a),
    }
}

/// `err` with its causes, `: ` between them, leaving out a cause whose text the message
/// before it already ends with: errors that print their source in their own message and
/// also return it from `source()` (`io::Error`s wrapped by libraries) would otherwise show
/// it twice (`Address already in use (os error 98): Address already in use (os error 98)`).
fn error_chain(err: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !last.is_empty() && last.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        last = text;
    }
    out
}

/// Whether `err` comes from writing to a closed pipe (`strata generate | head`): not an
/// error for a command line.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Mesa's Vulkan device-select layer asks Wayland for the default GPU, and libwayland
/// prints `error: XDG_RUNTIME_DIR is invalid or not set in the environment` when it is
/// unset (containers, CI, ssh without a login session). Pointing it at an existing
/// directory lets the probe find no display, quietly. Setting the variable in this process
/// would take `unsafe` (another thread may read the environment), so `strata devices`, whose
/// whole output is the device list, runs itself again with it set. Commands that only open
/// a device on the side may still show Mesa's line once.
fn rerun_devices_with_runtime_dir(cli: &Cli) -> Option<ExitCode> {
    let valid = std::env::var_os("XDG_RUNTIME_DIR")
        .is_some_and(|d| Path::new(&d).is_absolute() && Path::new(&d).is_dir());
    if valid || !matches!(cli.command, Command::Devices(_)) {
        return None;
    }
    let status = std::process::Command::new(std::env::current_exe().ok()?)
        .args(std::env::args_os().skip(1))
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .status()
        .ok()?;
    Some(ExitCode::from(status.code().map_or(2, |c| c as u8)))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(code) = rerun_devices_with_runtime_dir(&cli) {
        return code;
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", error_chain(&err));
            ExitCode::from(2)
        }
    }
}
