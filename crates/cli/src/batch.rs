//! `strata batch`: run an OpenAI Batch API file through the continuous-batching scheduler.
//!
//! Resumable: requests whose `custom_id` is already in the output are skipped, and each
//! result is appended as one whole line, so an interrupted run loses at most the lines in
//! flight.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use strata_server::AppState;
use strata_server::offline::{Offline, custom_id};

use crate::model_arg::{DeviceArgs, ModelArgs};
use crate::progress::Progress;
use crate::serve::{SchedArgs, load_engine, model_id};

/// Arguments of `strata batch`.
#[derive(Debug, Args)]
pub struct BatchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sched: SchedArgs,
    /// Requests, one `{"custom_id", "method", "url", "body"}` per line.
    #[arg(long, short = 'i', value_name = "FILE")]
    input: PathBuf,
    /// Results, one `{"id", "custom_id", "response", "error"}` per line; appended to.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: PathBuf,
    // Last: its help headings would otherwise take in the options after it.
    #[command(flatten)]
    device: DeviceArgs,
}

/// Opens the output for appending after its last complete line, and returns the
/// `custom_id`s already there.
fn open_output(path: &Path) -> anyhow::Result<(File, HashSet<String>)> {
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    // A crash can leave a partial last line: drop it, its request runs again.
    let complete = text.rfind('\n').map_or(0, |i| i + 1);
    if complete < text.len() {
        file.set_len(complete as u64)
            .with_context(|| format!("truncating the partial last line of {}", path.display()))?;
        file.seek(SeekFrom::End(0))?;
    }
    let done = text[..complete].lines().filter_map(custom_id).collect();
    Ok((file, done))
}

pub fn run(args: BatchArgs) -> anyhow::Result<()> {
    crate::serve::init_logging();
    let input =
        File::open(&args.input).with_context(|| format!("opening {}", args.input.display()))?;
    let (mut out, done) = open_output(&args.output)?;
    let mut lines = Vec::new();
    let mut skipped = 0usize;
    for (i, line) in BufReader::new(input).lines().enumerate() {
        let line =
            line.with_context(|| format!("reading {} line {}", args.input.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        if custom_id(&line).is_some_and(|id| done.contains(&id)) {
            skipped += 1;
            continue;
        }
        lines.push((i, line));
    }
    let total = lines.len();
    eprintln!(
        "{total} requests to run, {skipped} already in {}",
        args.output.display()
    );
    if total == 0 {
        return Ok(());
    }

    let path = args.model.dir()?;
    let loaded = load_engine(&args.model, &args.device, &path)?;
    let (engine, exec, ssd) = (loaded.engine, loaded.hybrid, loaded.ssd);
    let engine = Arc::new(engine);
    let config = args.sched.config(&engine)?;
    let state = Arc::new(AppState::new(engine, config, model_id(&path)));
    let offline = Offline::new(state)?;

    let started = Instant::now();
    let (mut finished, mut failed, mut prompt_tokens, mut gen_tokens) =
        (0usize, 0usize, 0u64, 0u64);
    let mut write_err = None;
    let mut progress = Progress::new("batch", total as u64, "requests");
    offline.run(lines, |_, r| {
        finished += 1;
        failed += usize::from(!r.ok);
        prompt_tokens += r.prompt_tokens;
        gen_tokens += r.completion_tokens;
        if write_err.is_none() {
            // One write per line: O_APPEND keeps whole lines even if the process dies.
            let mut bytes = r.line.into_bytes();
            bytes.push(b'\n');
            if let Err(e) = out.write_all(&bytes) {
                write_err = Some(e);
            }
        }
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        let note = format!(
            "{failed} failed, {gen_tokens} tokens generated, {:.1} tok/s",
            gen_tokens as f64 / secs
        );
        progress.set(finished as u64, &note);
    });
    drop(progress);
    if let Some(e) = write_err {
        return Err(e).with_context(|| format!("writing {}", args.output.display()));
    }
    out.sync_all()
        .with_context(|| format!("syncing {}", args.output.display()))?;
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    eprintln!(
        "done: {finished} requests ({failed} failed) in {secs:.2} s: {:.2} requests/s, \
         {prompt_tokens} prompt tokens ({:.1} tok/s), {gen_tokens} generated ({:.1} tok/s)",
        finished as f64 / secs,
        prompt_tokens as f64 / secs,
        gen_tokens as f64 / secs,
    );
    if let Some(tier) = ssd {
        eprintln!("expert cache: {}", tier.stats());
    }
    if let Some(exec) = exec {
        eprintln!("hybrid, policy {}: {}", exec.policy_name(), exec.stats());
    }
    Ok(())
}
