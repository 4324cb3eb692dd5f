//! `strata bench grammar`: what structured outputs cost per generated token.
//!
//! For each batch size it decodes the same batch twice, constrained by a JSON schema and
//! free, with the runtime's own per-sequence step ([`SequenceState::accept`]) and one
//! batched forward pass per step, as the engine and the scheduler do. End-of-sequence ids
//! are ignored and the default schema (an array of at least 40 records) cannot complete
//! within the token budget, so both runs decode exactly `batch x tokens` tokens. The free
//! run samples as usual but feeds the model the tokens the constrained run chose: a MoE
//! model's step time depends on which experts its tokens route to (similar JSON tokens
//! share experts, free text spreads over many), and the overhead must not include that.
//! It reports, per token: the sampling thread's time (masking, waiting for the mask,
//! sampling, advancing the grammar), the mask computation on the grammar's helper thread,
//! and the end-to-end overhead (constrained minus free decode time), the best of
//! `--repeats` runs each.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::{Value, json};
use strata_model::LogitsWanted;
use strata_model::backend::BatchSeq;
use strata_runtime::engine::Engine;
use strata_runtime::grammar::{Grammar, GrammarStats, ResponseFormat};
use strata_runtime::sampling::{Sampler, SamplingParams};
use strata_runtime::step::{SequenceOptions, SequenceState};

use crate::model_arg::ModelArgs;

/// Arguments of `strata bench grammar`.
#[derive(Debug, Args)]
pub struct BenchGrammarArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Sequences decoded together.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    batch: Vec<usize>,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// JSON Schema to enforce (default: an array of at least 40 records with strings,
    /// enums, bounded numbers, nested arrays and optional fields).
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
    /// Runs per configuration; the fastest counts.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

/// The default schema: long enough never to complete within the token budget.
fn default_schema() -> Value {
    json!({
        "type": "array",
        "minItems": 40,
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 100000},
                "name": {"type": "string", "maxLength": 16},
                "role": {"enum": ["admin", "user", "guest"]},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
                "active": {"type": "boolean"}
            },
            "required": ["id", "name", "role", "active"],
            "additionalProperties": false
        }
    })
}

/// Times of one run.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    /// Decode wall time (after the prompt's prefill).
    decode: Duration,
    /// Time in `accept` on the sampling thread.
    accept: Duration,
    tokens: usize,
    grammar: GrammarStats,
}

pub fn run(args: BenchGrammarArgs) -> anyhow::Result<()> {
    let dir = args.model.dir()?;
    let engine = Engine::load(&dir, args.model.load_options())?;
    let schema = match &args.json_schema {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the JSON schema {}", path.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("the JSON schema {} is not valid JSON", path.display()))?
        }
        None => default_schema(),
    };
    let started = Instant::now();
    let grammar = engine
        .compile_format(&ResponseFormat::JsonSchema(schema))
        .context("the schema cannot be enforced")?;
    let compile = started.elapsed();
    let prompt = engine.text_prompt("Here are the users as JSON:")?;
    let mut rows = Vec::new();
    for &batch in &args.batch {
        let (batch, tokens) = (batch.max(1), args.tokens.max(1));
        let mut free: Option<Run> = None;
        let mut constrained: Option<Run> = None;
        // Alternate the two so that a change in the machine's load hits both.
        for _ in 0..args.repeats.max(1) {
            let (c, chosen) = decode(&engine, &prompt, batch, tokens, Mode::Constrained(&grammar))?;
            let (f, _) = decode(&engine, &prompt, batch, tokens, Mode::Replay(&chosen))?;
            for (best, r) in [(&mut constrained, c), (&mut free, f)] {
                if best.is_none_or(|b| r.decode < b.decode) {
                    *best = Some(r);
                }
            }
        }
        let (free, constrained) = (free.unwrap_or_default(), constrained.unwrap_or_default());
        let per_token = |d: Duration, r: &Run| d.as_secs_f64() * 1e6 / r.tokens.max(1) as f64;
        let row = json!({
            "batch": batch,
            "tokens": constrained.tokens,
            "free_us_per_token": per_token(free.decode, &free),
            "constrained_us_per_token": per_token(constrained.decode, &constrained),
            "overhead_us_per_token":
                per_token(constrained.decode, &constrained) - per_token(free.decode, &free),
            "free_sampling_us_per_token": per_token(free.accept, &free),
            "constrained_sampling_us_per_token": per_token(constrained.accept, &constrained),
            "mask_us_per_token": constrained.grammar.compute_us_per_token(),
            "mask_wait_us_per_token": per_token(constrained.grammar.wait, &constrained),
            "advance_us_per_token": per_token(constrained.grammar.commit, &constrained),
        });
        if !args.json {
            print_row(&row)?;
        }
        rows.push(row);
    }
    if args.json {
        let doc = json!({
            "model": dir.display().to_string(),
            "vocab": engine.model.config().vocab_size,
            "compile_ms": compile.as_secs_f64() * 1e3,
            "threads": strata_kernels::num_threads(),
            "rows": rows,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        outln!(
            "vocabulary {}, schema compiled in {:.1} ms, {} compute threads",
            engine.model.config().vocab_size,
            compile.as_secs_f64() * 1e3,
            strata_kernels::num_threads()
        )?;
    }
    Ok(())
}

fn print_row(r: &Value) -> std::io::Result<()> {
    let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    outln!(
        "batch {:>3}: {:>5} tokens | decode {:>8.1} us/token free, {:>8.1} constrained: overhead {:>7.1} us/token ({:+.1}%) | sampling thread {:>6.1} -> {:>6.1} us/token (mask wait {:.1}, grammar advance {:.1}) | mask {:.1} us/token on the helper thread",
        r["batch"],
        r["tokens"],
        f("free_us_per_token"),
        f("constrained_us_per_token"),
        f("overhead_us_per_token"),
        100.0 * f("overhead_us_per_token") / f("free_us_per_token"),
        f("free_sampling_us_per_token"),
        f("constrained_sampling_us_per_token"),
        f("mask_wait_us_per_token"),
        f("advance_us_per_token"),
        f("mask_us_per_token"),
    )?;
    Ok(())
}

/// How a decode run chooses what it feeds the model.
#[derive(Clone, Copy)]
enum Mode<'a> {
    /// Sample under the grammar and feed the sampled tokens.
    Constrained(&'a Grammar),
    /// Sample freely but feed these tokens (per sequence, per step).
    Replay(&'a [Vec<u32>]),
}

/// Prefills `batch` copies of `prompt`, then decodes `tokens` steps for all of them;
/// returns the timings and the tokens fed.
fn decode(
    engine: &Engine,
    prompt: &[u32],
    batch: usize,
    tokens: usize,
    mode: Mode<'_>,
) -> anyhow::Result<(Run, Vec<Vec<u32>>)> {
    let opts = SequenceOptions {
        max_tokens: tokens,
        ctx_size: prompt.len() + tokens + 1,
        stop: &[],
        ignore_eos: true,
        top_logprobs: None,
        keep_special: &[],
    };
    let mut states = (0..batch)
        .map(|i| {
            let sampling = SamplingParams {
                seed: Some(i as u64),
                ..SamplingParams::default()
            };
            let mut s =
                SequenceState::new(&engine.tokenizer, Sampler::new(sampling)?, prompt, opts)?;
            if let Mode::Constrained(g) = mode {
                s.constrain(g.clone())?;
            }
            Ok(s)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut caches = (0..batch)
        .map(|_| engine.model.new_cache(prompt.len() + tokens + 1))
        .collect::<Result<Vec<_>, _>>()?;
    let mut inputs: Vec<BatchSeq<'_>> = caches
        .iter_mut()
        .map(|cache| BatchSeq {
            tokens: prompt,
            cache: &mut **cache,
            logits: LogitsWanted::Last,
        })
        .collect();
    let mut logits = engine.model.forward(&mut inputs)?;
    drop(inputs);
    let mut run = Run::default();
    let mut chosen = vec![Vec::with_capacity(tokens); batch];
    let started = Instant::now();
    for step in 0.. {
        let t = Instant::now();
        for (state, l) in states.iter_mut().zip(&logits) {
            state.accept(l)?;
            run.tokens += 1;
        }
        run.accept += t.elapsed();
        if states.iter().any(|s| s.finish().is_some()) {
            break;
        }
        for (i, (s, c)) in states.iter().zip(&mut chosen).enumerate() {
            let id = match mode {
                Mode::Constrained(_) => s.next_input()[0],
                Mode::Replay(replay) => replay[i][step],
            };
            c.push(id);
        }
        let mut inputs: Vec<BatchSeq<'_>> = chosen
            .iter()
            .zip(caches.iter_mut())
            .map(|(c, cache)| BatchSeq {
                tokens: &c[step..],
                cache: &mut **cache,
                logits: LogitsWanted::Last,
            })
            .collect();
        logits = engine.model.forward(&mut inputs)?;
    }
    run.decode = started.elapsed();
    for s in &states {
        if let Some(g) = s.grammar_stats() {
            run.grammar.add(&g);
        }
    }
    Ok((run, chosen))
}
