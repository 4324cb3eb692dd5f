//! `strata generate`: stream a continuation of a prompt or a reply to a chat message.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use strata_runtime::engine::FinishReason;
use strata_runtime::grammar::{GrammarStats, ResponseFormat};
use strata_runtime::scheduler::{GenRequest, generate_batch};
use strata_runtime::text::ChatMessage;

use crate::model_arg::{DeviceArgs, ModelArgs, SamplingArgs};

/// Arguments of `strata generate`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "chat"])))]
#[command(allow_negative_numbers = true)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Plain text to continue (tokenized as is, with BOS if the model uses one); `-` reads
    /// it from stdin (less one final newline).
    #[arg(long, short = 'p', value_name = "TEXT")]
    prompt: Option<String>,
    /// A user message, formatted with the model's chat template.
    #[arg(long, value_name = "TEXT")]
    chat: Option<String>,
    /// A system message placed before `--chat`.
    #[arg(long, value_name = "TEXT", requires = "chat")]
    system: Option<String>,
    /// Most tokens to generate (at least 1, as the server's `max_tokens`).
    #[arg(long, short = 'n', default_value_t = 128, value_parser = parse_max_tokens)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Stop when this string appears (repeatable); it is not printed.
    #[arg(long, value_name = "TEXT")]
    stop: Vec<String>,
    /// Write JSON valid for the JSON Schema in FILE, enforced token by token.
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
    /// Write a JSON object, enforced token by token.
    #[arg(long, conflicts_with = "json_schema")]
    json: bool,
    // Last: its help headings would otherwise take in the options after it.
    #[command(flatten)]
    device: DeviceArgs,
}

/// `--max-tokens`: a count of at least 1. Generation samples its first token from the
/// prompt's logits, so 0 cannot be honoured; it is refused as the server refuses
/// `max_tokens: 0`.
pub(crate) fn parse_max_tokens(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1 (the server refuses max_tokens: 0 alike)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{s}` is not a count: {e}")),
    }
}

/// `--prompt`'s text: `-` reads all of stdin.
fn prompt_text(prompt: &str) -> anyhow::Result<String> {
    if prompt != "-" {
        return Ok(prompt.to_owned());
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("--prompt -: reading the prompt from stdin")?;
    // `echo text |` and files end in a newline that is not part of the prompt.
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        bail!("--prompt -: stdin was empty");
    }
    Ok(text.to_owned())
}

pub fn run(mut args: GenerateArgs) -> anyhow::Result<()> {
    if let Some(p) = &args.prompt {
        args.prompt = Some(prompt_text(p)?);
    }
    let dir = args.model.dir()?;
    let loaded = args.device.load_engine(&args.model, &dir)?;
    let (engine, hybrid, accel, load) = (loaded.engine, loaded.hybrid, loaded.accel, loaded.took);
    let ssd = loaded.ssd;
    let prompt = match &args.prompt {
        Some(p) => engine.text_prompt(p)?,
        None => engine.chat_prompt(&messages(&args))?,
    };
    engine.check_cache_memory(
        (prompt.len() + args.max_tokens) as u64,
        0,
        "lower --max-tokens or shorten the prompt",
    )?;
    let grammar = match response_format(&args)? {
        Some(f) => Some(engine.compile_format(&f).context(format_origin(&args))?),
        None => None,
    };
    let request = GenRequest {
        stop: args.stop.clone(),
        grammar,
        ..GenRequest::new(prompt, args.max_tokens, args.sampling.params())
    };
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    // The accelerator's traffic when the first token is out (prefill done) and at the end:
    // what decoding asks of it per token.
    let traffic = || accel.as_ref().map(|d| d.traffic());
    let kernel_times = || accel.as_ref().and_then(|d| d.kernel_times());
    let mut after_prefill = None;
    let mut kernels_after_prefill = None;
    let mut ssd_after_prefill = None;
    let mut hybrid_after_prefill = None;
    let (outputs, stats) = generate_batch(&engine, std::slice::from_ref(&request), |_, text| {
        if after_prefill.is_none() {
            after_prefill = traffic();
            kernels_after_prefill = kernel_times();
        }
        if ssd_after_prefill.is_none() {
            ssd_after_prefill = ssd.as_ref().map(|t| t.stats());
        }
        if hybrid_after_prefill.is_none() {
            hybrid_after_prefill = hybrid.as_ref().map(|e| e.stats());
        }
        if write_err.is_none()
            && let Err(e) = stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
        {
            write_err = Some(e);
        }
    })?;
    if let Some(e) = write_err {
        return Err(e).context("writing to stdout");
    }
    writeln!(stdout)
        .and_then(|()| stdout.flush())
        .context("writing to stdout")?;
    eprintln!(
        "[load {}, {} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, finish: {}, device: {}]",
        seconds(load),
        stats.prompt_tokens,
        stats.prefill_tps(),
        outputs[0].tokens.len(),
        stats.decode_tps(),
        finish_name(&outputs[0].finish),
        engine.model.device(),
    );
    if let Some(g) = &outputs[0].grammar {
        print_grammar_stats(g);
    }
    if let (Some(tier), Some(start)) = (&ssd, ssd_after_prefill) {
        let end = tier.stats();
        let decoded = outputs[0].tokens.len().saturating_sub(1).max(1);
        let decode = end.since(&start);
        eprintln!(
            "[expert cache: {end}; prefill {:.1}% hits, {:.1} MiB read; decode {:.1}% hits, {:.1} MiB read per token]",
            100.0 * start.hit_rate(),
            start.bytes_read as f64 / (1u64 << 20) as f64,
            100.0 * decode.hit_rate(),
            decode.bytes_read as f64 / (1u64 << 20) as f64 / decoded as f64,
        );
    }
    if let Some(exec) = hybrid {
        let end = exec.stats();
        // The CPU's expert time per decoded token, beside the device line's waits: where a
        // hybrid token's time goes.
        let decoded = outputs[0].tokens.len().saturating_sub(1).max(1) as f64;
        let decode_cpu = match &hybrid_after_prefill {
            Some(start) => end.cpu_time.saturating_sub(start.cpu_time),
            None => end.cpu_time,
        };
        eprintln!(
            "[hybrid, policy {}: {end}; decode: CPU experts {:.2} ms per token]",
            exec.policy_name(),
            decode_cpu.as_secs_f64() * 1e3 / decoded,
        );
    }
    if let (Some(dev), Some(start), Some(end)) = (&accel, after_prefill, traffic()) {
        print_traffic(
            &**dev,
            end.since(start),
            outputs[0].tokens.len().saturating_sub(1),
        );
    }
    if let (Some(prefill), Some(end)) = (kernels_after_prefill, kernel_times()) {
        print_kernel_times(
            &prefill,
            &end.since(&prefill),
            outputs[0].tokens.len().saturating_sub(1),
        );
    }
    Ok(())
}

/// The accelerator's line: memory it holds, and per decoded token the submissions, the
/// dispatches, the host time recording and submitting them, host round trips (downloads)
/// and the host's time blocked on them, and bytes each way.
fn print_traffic(dev: &dyn strata_accel::Device, decode: strata_accel::Traffic, tokens: usize) {
    let per = |n: u64| n as f64 / tokens.max(1) as f64;
    eprintln!(
        "[{}: {:.1} MiB resident; per decoded token ({tokens}): {:.1} submissions, {:.0} dispatches ({:.1} new bind groups) recorded in {:.2} ms and submitted in {:.2} ms of host time, {:.1} host round trips waited on for {:.2} ms, {:.1} KiB up, {:.1} KiB down]",
        dev.info().name,
        dev.memory().live as f64 / (1u64 << 20) as f64,
        per(decode.submissions),
        per(decode.dispatches),
        per(decode.bind_groups),
        per(decode.record_ns) / 1e6,
        per(decode.submit_ns) / 1e6,
        per(decode.downloads),
        per(decode.wait_ns) / 1e6,
        per(decode.uploaded) / 1024.0,
        per(decode.downloaded) / 1024.0,
    );
}

/// `STRATA_GPU_PROFILE=1`'s table: each kernel's device time in prefill and per decoded
/// token, most decode time first.
fn print_kernel_times(
    prefill: &strata_accel::KernelTimes,
    decode: &strata_accel::KernelTimes,
    tokens: usize,
) {
    let per = tokens.max(1) as f64;
    eprintln!(
        "[device time by kernel: prefill {:.2} ms, decode {:.1} us per token ({} and {} dispatches not timed)]",
        prefill.total_ns() as f64 / 1e6,
        decode.total_ns() as f64 / 1e3 / per,
        prefill.untimed,
        decode.untimed,
    );
    eprintln!("| kernel | prefill calls | prefill ms | decode calls/token | decode us/token |");
    eprintln!("|---|---|---|---|---|");
    let mut names: Vec<&str> = decode.by_time().into_iter().map(|(n, _)| n).collect();
    names.extend(
        prefill
            .by_time()
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| !decode.kernels.contains_key(*n)),
    );
    for name in names {
        let p = prefill.kernels.get(name).copied().unwrap_or_default();
        let d = decode.kernels.get(name).copied().unwrap_or_default();
        eprintln!(
            "| {name} | {} | {:.2} | {:.1} | {:.1} |",
            p.calls,
            p.ns as f64 / 1e6,
            d.calls as f64 / per,
            d.ns as f64 / 1e3 / per,
        );
    }
}

/// A duration as the stats line shows it: milliseconds below a second.
pub(crate) fn seconds(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.0} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// `--json-schema FILE` or `--json`, read and parsed.
fn response_format(args: &GenerateArgs) -> anyhow::Result<Option<ResponseFormat>> {
    let Some(path) = &args.json_schema else {
        return Ok(args.json.then_some(ResponseFormat::JsonObject));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the JSON schema {}", path.display()))?;
    let schema = serde_json::from_str(&text)
        .with_context(|| format!("the JSON schema {} is not valid JSON", path.display()))?;
    Ok(Some(ResponseFormat::JsonSchema(schema)))
}

/// What a grammar error is about: the schema file or `--json`.
fn format_origin(args: &GenerateArgs) -> String {
    match &args.json_schema {
        Some(path) => format!("the JSON schema {} cannot be enforced", path.display()),
        None => "--json cannot be enforced".into(),
    }
}

fn print_grammar_stats(g: &GrammarStats) {
    eprintln!(
        "[grammar: {} tokens, mask {:.0} us/token on its thread, {:.0} us/token on the sampling thread]",
        g.tokens,
        g.compute_us_per_token(),
        g.sampling_us_per_token(),
    );
}

pub(crate) fn finish_name(finish: &FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ContextFull => "context full",
    }
}

fn messages(args: &GenerateArgs) -> Vec<ChatMessage> {
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(ChatMessage::new("system", s));
    }
    if let Some(c) = &args.chat {
        messages.push(ChatMessage::new("user", c));
    }
    messages
}
