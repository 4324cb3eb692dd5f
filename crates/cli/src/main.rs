//! The `strata` command line: `info`, `generate`, `logits`, `serve`, `batch`, `trace`,
//! `simulate`, `stratify`, `devices`, `bench moe`, `convert`.
//!
//! Arguments are parsed by clap into raw values, then validated into the typed settings the
//! library crates take. Errors print with their whole cause chain and exit with status 2; a
//! closed stdout (`strata generate | head`) is not an error.

mod batch;
mod bench;
mod bench_grammar;
mod convert;
mod devices;
mod generate;
mod hub;
mod info;
mod logits;
mod model_arg;
mod serve;
mod simulate;
mod stratify;
mod trace;

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
    /// Time structured outputs: the grammar's cost per generated token at each batch size.
    Grammar(bench_grammar::BenchGrammarArgs),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info(a) => info::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Batch(a) => batch::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Bench(BenchCommand::Moe(a)) => bench::bench_moe(&a),
        Command::Bench(BenchCommand::Grammar(a)) => bench_grammar::run(a),
        Command::Devices(a) => devices::run(a),
        Command::Trace(a) => trace::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Stratify(a) => stratify::run(a),
        Command::Convert(a) => convert::run(a),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let broken_pipe = err.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            });
            if broken_pipe {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
