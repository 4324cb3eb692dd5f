//! Continuous batching: one thread runs the model for every request in flight.
//!
//! A [`Scheduler`] owns a thread that loops over steps. Between steps, new requests join the
//! running batch (first come, first served, up to `max_batch` sequences) and finished or
//! cancelled ones leave it, their KV caches dropped at once. Each step runs one batched
//! forward pass: one token for every decoding sequence, then prompt chunks of the prefilling
//! ones, in admission order, within a token budget (`step_tokens`), so a long prompt never
//! stalls the decodes already running. Every generated token goes back to its requester as
//! an [`Event`] through its [`EventSink`]; the last event is [`Event::Done`] (or
//! [`Event::Failed`]).
//!
//! Full prompt blocks go into a shared [`PrefixCache`] as they are prefilled, and a new
//! sequence starts from the longest prefix found there (`prefix_cache_bytes`, 0 disables
//! it); its `Done` event reports how many prompt tokens came from the cache. Sequences that
//! share a prompt no one has prefilled yet (a burst of requests with one system prompt)
//! compute it once: a prefilling sequence waits while one admitted before it computes the
//! block it needs next, and takes that block from the cache when it is done.
//!
//! A key design decision made here is that requesters talk to the scheduler through a sink
//! trait rather than a particular channel type: the server plugs in an async channel, the
//! offline batch mode a plain closure, and this crate stays free of any async runtime. A
//! sink that reports its receiver gone (a disconnected client) cancels its sequence before
//! the next step.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use strata_model::LogitsWanted;

use strata_model::backend::{BatchSeq, SeqCache};

use crate::engine::{Engine, FinishReason};
use crate::grammar::{Grammar, GrammarStats};
use crate::prefix_cache::{BLOCK, PrefixCache, block_hashes};
use crate::sampling::{Sampler, SamplingError, SamplingParams};
pub use crate::step::TokenLogprobs;
use crate::step::{SequenceOptions, SequenceState};

mod admission;
pub use admission::{AdmissionError, SchedulerLimits, Spelling};

/// Identifies a submitted sequence (for [`Scheduler::cancel`]).
pub type SeqId = u64;

/// Smallest prompt chunk a step gives the prefilling sequences, so that prompts advance
/// even when the decodes use up the whole token budget.
const MIN_PREFILL_CHUNK: usize = 16;

/// Limits of a [`Scheduler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences in the running batch.
    pub max_batch: usize,
    /// Most requests waiting for a place in the batch; more are refused.
    pub max_queue: usize,
    /// Token budget of one step (decode tokens plus prompt chunk tokens).
    pub step_tokens: usize,
    /// Context length: prompt plus generated tokens of one sequence.
    pub ctx_size: usize,
    /// Budget of the shared prefix cache in bytes of KV rows; 0 disables it.
    pub prefix_cache_bytes: usize,
}

impl SchedulerConfig {
    /// These limits as a scheduler for `engine` applies them: `ctx_size` capped at the
    /// model's context, zero limits raised to 1.
    fn within(self, engine: &Engine) -> SchedulerConfig {
        SchedulerConfig {
            max_batch: self.max_batch.max(1),
            max_queue: self.max_queue.max(1),
            step_tokens: self.step_tokens.max(1),
            ctx_size: self
                .ctx_size
                .clamp(2, engine.model.config().max_position_embeddings.max(2)),
            prefix_cache_bytes: self.prefix_cache_bytes,
        }
    }

    /// Defaults for `engine`: a batch of 16, a queue of 256, 512 tokens per step, the
    /// model's full context and no prefix cache (its memory is the caller's to grant).
    pub fn for_engine(engine: &Engine) -> SchedulerConfig {
        SchedulerConfig {
            max_batch: 16,
            max_queue: 256,
            step_tokens: 512,
            ctx_size: engine.model.config().max_position_embeddings,
            prefix_cache_bytes: 0,
        }
    }
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate, at least 1.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Strings that end generation (not included in the output).
    pub stop: Vec<String>,
    /// `Some(n)`: report each token's log-probability and the `n` most likely alternatives.
    pub top_logprobs: Option<usize>,
    /// Keep generating past end-of-sequence tokens (benchmarks with fixed output lengths).
    pub ignore_eos: bool,
    /// A grammar the output must follow (structured outputs).
    pub grammar: Option<Grammar>,
    /// Special ids kept in the text (the tool-call markers that are special tokens).
    pub keep_special: Vec<u32>,
}

impl GenRequest {
    /// Up to `max_tokens` tokens after `prompt`, sampled with `sampling`: no stop strings,
    /// log-probabilities, grammar or kept special ids (set those fields after).
    pub fn new(prompt: Vec<u32>, max_tokens: usize, sampling: SamplingParams) -> GenRequest {
        GenRequest {
            prompt,
            max_tokens,
            sampling,
            stop: Vec::new(),
            top_logprobs: None,
            ignore_eos: false,
            grammar: None,
            keep_special: Vec::new(),
        }
    }
}

/// What a sequence reports back.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text it completes (possibly empty: text is held back
    /// while it may be the start of a stop string or an incomplete character).
    Token {
        /// Token id.
        id: u32,
        /// Text completed by this token.
        text: String,
        /// Log-probabilities, when the request asked for them.
        logprobs: Option<TokenLogprobs>,
    },
    /// The sequence ended; the last event.
    Done {
        /// Why.
        finish: FinishReason,
        /// Text still held back at the end (append it to the output).
        text: String,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens (the `Token` events).
        completion_tokens: usize,
        /// Prompt tokens whose KV rows came from the prefix cache (not prefilled).
        cached_tokens: usize,
        /// Time spent on its grammar, when it had one.
        grammar: Option<GrammarStats>,
    },
    /// The sequence could not go on; the last event. The message is for logs.
    Failed(String),
}

/// Where a sequence's events go.
pub trait EventSink: Send {
    /// Delivers one event; returns `false` when the receiver is gone, which cancels the
    /// sequence.
    fn send(&mut self, event: Event) -> bool;
    /// Whether the receiver is gone; checked before every step so that an abandoned
    /// sequence costs no further compute. Defaults to `false`.
    fn is_closed(&self) -> bool {
        false
    }
}

impl<F: FnMut(Event) -> bool + Send> EventSink for F {
    fn send(&mut self, event: Event) -> bool {
        self(event)
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedulerError {
    /// The waiting queue is full (the server answers 429).
    #[error("the queue is full ({max} requests waiting); retry later")]
    QueueFull {
        /// The queue's capacity.
        max: usize,
    },
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt leaves no room for a generated token.
    #[error(
        "the prompt has {tokens} tokens but the context holds {ctx_size}: at most {} prompt tokens fit",
        ctx_size.saturating_sub(1)
    )]
    PromptTooLong {
        /// Prompt tokens.
        tokens: usize,
        /// Context length.
        ctx_size: usize,
    },
    /// `max_tokens` is 0.
    #[error("max_tokens must be at least 1, got 0")]
    ZeroMaxTokens,
    /// A stop string is empty.
    #[error("stop string {index} is empty")]
    EmptyStop {
        /// Its index.
        index: usize,
    },
    /// Invalid sampling settings.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The scheduler is shutting down.
    #[error("the scheduler is shutting down")]
    ShuttingDown,
}

/// Counters shared between the handle and the thread.
#[derive(Debug, Default)]
struct Shared {
    queued: AtomicUsize,
    active: AtomicUsize,
    generated: AtomicU64,
    next_id: AtomicU64,
    closed: AtomicBool,
    cached_tokens: AtomicU64,
    prefilled_tokens: AtomicU64,
    prefix_bytes: AtomicUsize,
    prefix_blocks: AtomicUsize,
    /// Bytes of the running sequences' own KV caches.
    kv_bytes: AtomicUsize,
}

enum Command {
    Submit(Box<Pending>),
    Cancel(SeqId),
    Shutdown,
}

struct Pending {
    id: SeqId,
    req: GenRequest,
    sampler: Sampler,
    sink: Box<dyn EventSink>,
}

/// Checks a request against the limits before it is queued, so that every refusal comes
/// back before anything runs; returns its sampler.
fn check_request(req: &GenRequest, cfg: &SchedulerConfig) -> Result<Sampler, SchedulerError> {
    if req.prompt.is_empty() {
        return Err(SchedulerError::EmptyPrompt);
    }
    if req.prompt.len() >= cfg.ctx_size {
        return Err(SchedulerError::PromptTooLong {
            tokens: req.prompt.len(),
            ctx_size: cfg.ctx_size,
        });
    }
    if req.max_tokens == 0 {
        return Err(SchedulerError::ZeroMaxTokens);
    }
    if let Some(index) = req.stop.iter().position(String::is_empty) {
        return Err(SchedulerError::EmptyStop { index });
    }
    Ok(Sampler::new(req.sampling.clone())?)
}

/// Handle to the scheduling thread; dropping it finishes the work in flight and joins the
/// thread.
pub struct Scheduler {
    commands: Mutex<mpsc::Sender<Command>>,
    shared: Arc<Shared>,
    config: SchedulerConfig,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// Starts the scheduling thread for `engine`. `ctx_size` is capped at the model's
    /// context; zero limits are raised to 1.
    pub fn start(engine: Arc<Engine>, config: SchedulerConfig) -> Scheduler {
        let config = config.within(&engine);
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("strata-scheduler".into())
            .spawn(move || run(&engine, config, &rx, &thread_shared))
            .expect("spawning the scheduler thread");
        Scheduler {
            commands: Mutex::new(tx),
            shared,
            config,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// The limits in force.
    pub fn config(&self) -> SchedulerConfig {
        self.config
    }

    /// Queues a request. Its events go to `sink`; the request is checked here so that
    /// every refusal comes back before anything runs.
    pub fn submit(
        &self,
        req: GenRequest,
        sink: Box<dyn EventSink>,
    ) -> Result<SeqId, SchedulerError> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(SchedulerError::ShuttingDown);
        }
        let sampler = check_request(&req, &self.config)?;
        let max = self.config.max_queue;
        self.shared
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < max).then_some(q + 1)
            })
            .map_err(|_| SchedulerError::QueueFull { max })?;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let pending = Box::new(Pending {
            id,
            req,
            sampler,
            sink,
        });
        let sent = self
            .commands
            .lock()
            .map_err(|_| SchedulerError::ShuttingDown)?
            .send(Command::Submit(pending));
        if sent.is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(SchedulerError::ShuttingDown);
        }
        Ok(id)
    }

    /// Cancels a sequence: it leaves the queue or the batch before the next step and its
    /// cache is freed. Unknown or finished ids are ignored.
    pub fn cancel(&self, id: SeqId) {
        if let Ok(tx) = self.commands.lock() {
            // A closed channel means the thread is gone and nothing is left to cancel.
            let _ = tx.send(Command::Cancel(id));
        }
    }

    /// Requests waiting for a place in the batch.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// Sequences in the running batch.
    pub fn active(&self) -> usize {
        self.shared.active.load(Ordering::Acquire)
    }

    /// Tokens generated since the start, by every sequence (cancelled ones included).
    pub fn generated_tokens(&self) -> u64 {
        self.shared.generated.load(Ordering::Relaxed)
    }

    /// Prompt tokens served from the prefix cache since the start.
    pub fn cached_tokens(&self) -> u64 {
        self.shared.cached_tokens.load(Ordering::Relaxed)
    }

    /// Prompt tokens run through the model (prefilled) since the start.
    pub fn prefilled_tokens(&self) -> u64 {
        self.shared.prefilled_tokens.load(Ordering::Relaxed)
    }

    /// Bytes the running sequences' own KV caches hold now (the prefix cache apart): 0
    /// whenever the batch is empty.
    pub fn kv_cache_bytes(&self) -> usize {
        self.shared.kv_bytes.load(Ordering::Acquire)
    }

    /// Bytes and blocks the prefix cache holds now.
    pub fn prefix_cache_usage(&self) -> (usize, usize) {
        (
            self.shared.prefix_bytes.load(Ordering::Relaxed),
            self.shared.prefix_blocks.load(Ordering::Relaxed),
        )
    }

    /// Refuses new requests, finishes those in flight and joins the thread.
    pub fn shutdown(&self) {
        self.shared.closed.store(true, Ordering::Release);
        if let Ok(tx) = self.commands.lock() {
            let _ = tx.send(Command::Shutdown);
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            // A panic on the scheduling thread has already been reported by the runtime.
            let _ = thread.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A sequence in the running batch.
struct Seq<'e> {
    id: SeqId,
    req: GenRequest,
    sink: Box<dyn EventSink>,
    /// Sampling, detokenizing, stopping and counting.
    state: SequenceState<'e>,
    cache: Box<dyn SeqCache>,
    /// Chained hashes of the prompt's full blocks (empty without a prefix cache).
    hashes: Vec<u64>,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    /// Prompt tokens that came from the prefix cache.
    cached: usize,
    decoding: bool,
    /// Set when the sequence is finished.
    finished: Option<Finished>,
}

impl Seq<'_> {
    /// Puts the sequence's tokens, prompt and answer, into the pool when it ends (before
    /// its requester hears so): the next turn of a chat sends them back as the start of its
    /// prompt. A sequence that failed leaves nothing.
    fn share_history(&self, pool: &mut PrefixCache) {
        if self.hashes.is_empty() || matches!(self.finished, Some(Finished::Tell(Event::Failed(_))))
        {
            return;
        }
        let mut tokens = self.req.prompt.clone();
        tokens.extend_from_slice(self.state.generated());
        // The cache holds every token fed to the model: all but a last sampled one.
        tokens.truncate(self.cache.len());
        if tokens.len() == self.cache.len() {
            pool.insert(&tokens, &block_hashes(&tokens), &*self.cache, tokens.len());
        }
    }

    /// Before a prefill chunk at a block boundary: takes the blocks the pool gained since
    /// (another sequence with the same prompt prefilled them), and returns whether to wait
    /// this step because a sequence planned before it is computing the block it needs next.
    /// A burst of requests with one new system prompt so prefills it once, the first of them
    /// leading, instead of once per request.
    fn catch_up(
        &mut self,
        pool: &mut PrefixCache,
        shared: &Shared,
        computing: &HashSet<u64>,
    ) -> bool {
        if self.hashes.is_empty() || !self.prefilled.is_multiple_of(BLOCK) {
            return false;
        }
        let more = pool.lookup(&self.req.prompt, &self.hashes, &mut *self.cache);
        self.prefilled += more;
        self.cached += more;
        shared
            .cached_tokens
            .fetch_add(more as u64, Ordering::Relaxed);
        self.hashes
            .get(self.prefilled / BLOCK)
            .is_some_and(|h| computing.contains(h))
    }
}

/// How a sequence ended.
enum Finished {
    /// With this last event, sent only after the sequence has left the batch so that a
    /// client that sees the end never sees itself still counted as active.
    Tell(Event),
    /// Its receiver is gone: nobody to tell.
    Abandoned,
}

/// Work of one sequence in one step.
#[derive(Clone, Copy)]
enum Work {
    Idle,
    Decode,
    Prefill(usize),
}

fn run(engine: &Engine, cfg: SchedulerConfig, rx: &mpsc::Receiver<Command>, shared: &Shared) {
    let mut waiting: VecDeque<Pending> = VecDeque::new();
    let mut running: Vec<Seq<'_>> = Vec::new();
    let mut shutting_down = false;
    let mut pool = PrefixCache::new(cfg.prefix_cache_bytes);
    loop {
        if running.is_empty() && waiting.is_empty() {
            if shutting_down {
                break;
            }
            match rx.recv() {
                Ok(cmd) => shutting_down |= handle(cmd, &mut waiting, &mut running, shared),
                Err(_) => break,
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            shutting_down |= handle(cmd, &mut waiting, &mut running, shared);
        }
        // Abandoned requests leave before they cost another forward pass.
        let before = waiting.len();
        waiting.retain(|p| !p.sink.is_closed());
        shared
            .queued
            .fetch_sub(before - waiting.len(), Ordering::AcqRel);
        running.retain(|s| !s.sink.is_closed());
        while running.len() < cfg.max_batch {
            let Some(p) = waiting.pop_front() else { break };
            shared.queued.fetch_sub(1, Ordering::AcqRel);
            if let Some(seq) = admit(engine, cfg, p, &mut pool) {
                shared
                    .cached_tokens
                    .fetch_add(seq.cached as u64, Ordering::Relaxed);
                running.push(seq);
            }
        }
        publish(shared, &running);
        if running.is_empty() {
            continue;
        }
        let generated = step(engine, cfg, &mut running, &mut pool, shared);
        shared.generated.fetch_add(generated, Ordering::Relaxed);
        let finished: Vec<Seq<'_>> = running.extract_if(.., |s| s.finished.is_some()).collect();
        publish(shared, &running);
        for mut seq in finished {
            seq.share_history(&mut pool);
            if let Some(Finished::Tell(last)) = seq.finished.take() {
                seq.sink.send(last);
            }
        }
        shared.prefix_bytes.store(pool.bytes(), Ordering::Relaxed);
        shared.prefix_blocks.store(pool.blocks(), Ordering::Relaxed);
    }
    publish(shared, &[]);
}

/// Publishes the batch's size and the bytes its caches hold, bytes first: a reader that
/// sees the size then reads bytes at least as recent.
fn publish(shared: &Shared, running: &[Seq<'_>]) {
    let bytes = running.iter().map(|s| s.cache.bytes()).sum();
    shared.kv_bytes.store(bytes, Ordering::Release);
    shared.active.store(running.len(), Ordering::Release);
}

/// Applies one command; returns whether it asks for shutdown.
fn handle(
    cmd: Command,
    waiting: &mut VecDeque<Pending>,
    running: &mut Vec<Seq<'_>>,
    shared: &Shared,
) -> bool {
    match cmd {
        Command::Submit(p) => waiting.push_back(*p),
        Command::Cancel(id) => {
            if let Some(i) = waiting.iter().position(|p| p.id == id) {
                waiting.remove(i);
                shared.queued.fetch_sub(1, Ordering::AcqRel);
            }
            running.retain(|s| s.id != id);
        }
        Command::Shutdown => return true,
    }
    false
}

/// Turns a queued request into a running sequence (or reports why it cannot run), its
/// cache started from the longest prefix `pool` holds.
fn admit<'e>(
    engine: &'e Engine,
    cfg: SchedulerConfig,
    mut p: Pending,
    pool: &mut PrefixCache,
) -> Option<Seq<'e>> {
    let opts = SequenceOptions {
        max_tokens: p.req.max_tokens,
        ctx_size: cfg.ctx_size,
        stop: &p.req.stop,
        ignore_eos: p.req.ignore_eos,
        top_logprobs: p.req.top_logprobs,
        keep_special: &p.req.keep_special,
    };
    let state = SequenceState::new(&engine.tokenizer, p.sampler, &p.req.prompt, opts)
        .map_err(|e| e.to_string())
        .and_then(|mut state| {
            // Taken out of the request: the grammar's state lives in the sequence.
            if let Some(g) = p.req.grammar.take() {
                state.constrain(g).map_err(|e| e.to_string())?;
            }
            Ok(state)
        });
    let state = state.and_then(|state| {
        let cache = engine
            .model
            .new_cache(cfg.ctx_size)
            .map_err(|e| e.to_string())?;
        Ok((state, cache))
    });
    let (state, mut cache) = match state {
        Ok(sc) => sc,
        Err(e) => {
            p.sink.send(Event::Failed(e));
            return None;
        }
    };
    let hashes = if cfg.prefix_cache_bytes > 0 {
        block_hashes(&p.req.prompt)
    } else {
        Vec::new()
    };
    let cached = pool.lookup(&p.req.prompt, &hashes, &mut *cache);
    Some(Seq {
        id: p.id,
        req: p.req,
        sink: p.sink,
        state,
        cache,
        hashes,
        prefilled: cached,
        cached,
        decoding: false,
        finished: None,
    })
}

/// One batched forward pass over the running sequences, then sampling; returns the
/// number of tokens sampled. Prompt blocks completed in this step go into `pool`.
fn step(
    engine: &Engine,
    cfg: SchedulerConfig,
    running: &mut [Seq<'_>],
    pool: &mut PrefixCache,
    shared: &Shared,
) -> u64 {
    let decodes = running.iter().filter(|s| s.decoding).count();
    let mut budget = cfg
        .step_tokens
        .saturating_sub(decodes)
        .max(MIN_PREFILL_CHUNK);
    // Blocks the sequences planned so far compute in this step.
    let mut computing = HashSet::new();
    let plan: Vec<Work> = running
        .iter_mut()
        .map(|s| {
            if s.decoding {
                return Work::Decode;
            }
            if s.catch_up(pool, shared, &computing) {
                return Work::Idle;
            }
            if budget == 0 {
                return Work::Idle;
            }
            let n = (s.req.prompt.len() - s.prefilled).min(budget);
            budget -= n;
            let blocks = s.prefilled / BLOCK..(s.prefilled + n).div_ceil(BLOCK);
            computing.extend(s.hashes.get(blocks).into_iter().flatten());
            Work::Prefill(n)
        })
        .collect();
    let mut inputs = Vec::with_capacity(running.len());
    let mut who = Vec::with_capacity(running.len());
    for (i, (seq, work)) in running.iter_mut().zip(&plan).enumerate() {
        let Seq {
            req,
            state,
            cache,
            prefilled,
            ..
        } = seq;
        let (tokens, logits) = match *work {
            Work::Idle => continue,
            Work::Decode => (state.next_input(), LogitsWanted::Last),
            Work::Prefill(n) => {
                let end = *prefilled + n;
                let wanted = if end == req.prompt.len() {
                    LogitsWanted::Last
                } else {
                    LogitsWanted::None
                };
                (&req.prompt[*prefilled..end], wanted)
            }
        };
        inputs.push(BatchSeq {
            tokens,
            cache: &mut **cache,
            logits,
        });
        who.push(i);
    }
    let result = engine.model.forward(&mut inputs);
    drop(inputs);
    let all_logits = match result {
        Ok(l) => l,
        Err(e) => {
            let msg = format!("forward pass failed: {e}");
            for &i in &who {
                running[i].finished = Some(Finished::Tell(Event::Failed(msg.clone())));
            }
            return 0;
        }
    };
    let mut sampled = 0;
    for (&i, logits) in who.iter().zip(all_logits) {
        let seq = &mut running[i];
        if let Work::Prefill(n) = plan[i] {
            seq.prefilled += n;
            shared
                .prefilled_tokens
                .fetch_add(n as u64, Ordering::Relaxed);
            pool.insert(&seq.req.prompt, &seq.hashes, &*seq.cache, seq.prefilled);
        }
        if !logits.is_empty() {
            seq.decoding = true;
            sampled += 1;
            sample_next(seq, &logits);
        }
    }
    sampled
}

/// Samples a sequence's next token from its logits, reports it, and records whether the
/// sequence ends.
fn sample_next(seq: &mut Seq<'_>, logits: &[f32]) {
    let outcome = match seq.state.accept(logits) {
        Ok(outcome) => outcome,
        Err(e) => {
            seq.finished = Some(Finished::Tell(Event::Failed(e.to_string())));
            return;
        }
    };
    // Text that comes with an end-of-sequence id goes with the last event.
    let mut last_text = outcome.tail;
    match outcome.token {
        Some(token) => {
            let event = Event::Token {
                id: token.id,
                text: outcome.text,
                logprobs: token.logprobs,
            };
            if !seq.sink.send(event) {
                seq.finished = Some(Finished::Abandoned);
                return;
            }
        }
        None => last_text.insert_str(0, &outcome.text),
    }
    if let Some(finish) = outcome.finish {
        seq.finished = Some(Finished::Tell(Event::Done {
            finish,
            text: last_text,
            prompt_tokens: seq.req.prompt.len(),
            completion_tokens: seq.state.generated().len(),
            cached_tokens: seq.cached,
            grammar: seq.state.grammar_stats(),
        }));
    }
}

mod offline;
pub use offline::{Output, Stats, generate_batch, run_batch};
#[cfg(test)]
mod tests;
