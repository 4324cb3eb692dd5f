//! A batch of requests run to the end by the scheduler's own loop, for callers that have
//! the whole batch up front (`strata generate`): one generation loop for every front end,
//! so batched offline generation chunks prompts, batches decodes and stops exactly as the
//! server does.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Command, Event, GenRequest, Pending, SchedulerConfig, SchedulerError, Shared};
use super::{check_request, run};
use crate::engine::{Engine, EngineError, FinishReason};
use crate::grammar::GrammarStats;

/// What one request produced.
#[derive(Debug, Clone)]
pub struct Output {
    /// Generated ids: every counted token, the one that completed a stop string included,
    /// a final end-of-sequence id excluded (see [`crate::step`]).
    pub tokens: Vec<u32>,
    /// Generated text (up to a stop string).
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// Time spent on its grammar, when it had one.
    pub grammar: Option<GrammarStats>,
}

/// Timing of a generation run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Wall time of prefill (until the first tokens were sampled).
    pub prefill: Duration,
    /// Tokens generated (after the first).
    pub decode_tokens: usize,
    /// Wall time of decoding.
    pub decode: Duration,
}

impl Stats {
    /// Prompt tokens per second.
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    /// Generated tokens per second (decode phase).
    pub fn decode_tps(&self) -> f64 {
        self.decode_tokens as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// Runs `requests` to the end and hands each event to `on_event` with its request's index,
/// on the calling thread, as it happens. The scheduling loop runs on a scoped thread that
/// borrows `engine`, so no `Arc` is needed. Every request is checked before any runs; a
/// refusal comes back with the index of the request refused.
pub fn run_batch(
    engine: &Engine,
    config: SchedulerConfig,
    requests: Vec<GenRequest>,
    mut on_event: impl FnMut(usize, Event),
) -> Result<(), (usize, SchedulerError)> {
    let config = config.within(engine);
    let samplers = requests
        .iter()
        .enumerate()
        .map(|(i, r)| check_request(r, &config).map_err(|e| (i, e)))
        .collect::<Result<Vec<_>, _>>()?;
    let (commands, rx) = mpsc::channel();
    let (events, received) = mpsc::channel();
    for (i, (req, sampler)) in requests.into_iter().zip(samplers).enumerate() {
        let events = events.clone();
        let pending = Pending {
            id: i as u64,
            req,
            sampler,
            sink: Box::new(move |e| events.send((i, e)).is_ok()),
        };
        // The receiver is alive until the loop below ends: this cannot fail.
        let _ = commands.send(Command::Submit(Box::new(pending)));
    }
    // The loop ends once every request is done and no sender is left.
    drop((commands, events));
    let shared = Shared::default();
    let shared = &shared;
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("strata-scheduler".into())
            .spawn_scoped(scope, move || run(engine, config, &rx, shared))
            .expect("spawning the scheduler thread");
        for (i, event) in received {
            on_event(i, event);
        }
    });
    Ok(())
}

/// Generates for every request together, on the scheduler's loop ([`run_batch`]):
/// prompts in chunks of [`Engine::prefill_chunk`] tokens per step, every sequence's
/// decode batched. `on_text(i, piece)` receives request `i`'s text as it is decoded.
pub fn generate_batch(
    engine: &Engine,
    requests: &[GenRequest],
    mut on_text: impl FnMut(usize, &str),
) -> Result<(Vec<Output>, Stats), EngineError> {
    let mut outputs: Vec<Option<Output>> = vec![None; requests.len()];
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
    let mut texts = vec![String::new(); requests.len()];
    let mut failed = None;
    let config = SchedulerConfig {
        max_batch: requests.len(),
        max_queue: requests.len(),
        step_tokens: engine.prefill_chunk,
        // Each sequence's cache is made for this context: no more than the longest
        // request needs.
        ctx_size: requests
            .iter()
            .map(|r| r.prompt.len() + r.max_tokens)
            .max()
            .unwrap_or(0),
        prefix_cache_bytes: 0,
    };
    // Prefill lasts until every request has its first token (or has ended).
    let mut started_decoding = vec![false; requests.len()];
    let mut waiting = requests.len();
    let started = Instant::now();
    let mut prefill = Duration::ZERO;
    run_batch(engine, config, requests.to_vec(), |i, event| {
        if !started_decoding[i] {
            started_decoding[i] = true;
            waiting -= 1;
            if waiting == 0 {
                prefill = started.elapsed();
            }
        }
        let piece = match event {
            Event::Token { id, text, .. } => {
                tokens[i].push(id);
                text
            }
            Event::Done {
                finish,
                text,
                grammar,
                ..
            } => {
                outputs[i] = Some(Output {
                    tokens: std::mem::take(&mut tokens[i]),
                    text: String::new(),
                    finish,
                    grammar,
                });
                text
            }
            Event::Failed(message) => {
                failed.get_or_insert(EngineError::Generation { index: i, message });
                return;
            }
        };
        if !piece.is_empty() {
            on_text(i, &piece);
            texts[i].push_str(&piece);
        }
    })
    .map_err(|(i, e)| EngineError::Request(format!("request {i}: {e}")))?;
    if let Some(e) = failed {
        return Err(e);
    }
    let outputs: Vec<Output> = outputs
        .into_iter()
        .zip(texts)
        .map(|(out, text)| Output {
            text,
            ..out.expect("every request ends with Done or Failed")
        })
        .collect();
    let stats = Stats {
        prompt_tokens: requests.iter().map(|r| r.prompt.len()).sum(),
        prefill,
        decode_tokens: outputs
            .iter()
            .map(|o| o.tokens.len().saturating_sub(1))
            .sum(),
        decode: started.elapsed().saturating_sub(prefill),
    };
    Ok((outputs, stats))
}
