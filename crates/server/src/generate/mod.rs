//! The generation endpoints: turn a request into scheduler sequences (one per prompt and
//! choice), then collect their events into one JSON response or stream them as
//! server-sent events.
//!
//! A key design decision made here is that both endpoints share one path and differ only
//! in a [`Kind`] that shapes the JSON: chat and legacy completions then cannot drift apart
//! in limits, accounting or cancellation.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use strata_runtime::engine::FinishReason;
use strata_runtime::grammar::Grammar;
use strata_runtime::sampling::{SamplingError, SamplingParams};
use strata_runtime::scheduler::{
    Event, EventSink, GenRequest, Scheduler, SchedulerError, SeqId, TokenLogprobs,
};
use strata_runtime::text::ChatMessage;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::AppState;
use crate::api::{self, ChatRequest, Common, CompletionRequest, MAX_N, MAX_TOP_LOGPROBS, Prompt};
use crate::error::ApiError;
use crate::log::{Tally, tagged};
use crate::structured;

/// Which endpoint: shapes the response JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// A checked request, ready to submit.
struct Job {
    kind: Kind,
    prompts: Vec<Vec<u32>>,
    /// Per prompt.
    max_tokens: Vec<usize>,
    n: usize,
    sampling: SamplingParams,
    stop: Vec<String>,
    top_logprobs: Option<usize>,
    ignore_eos: bool,
    stream: bool,
    include_usage: bool,
    /// The compiled `response_format`, cloned into each choice.
    grammar: Option<Grammar>,
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    st.metrics.chat_requests.fetch_add(1, Ordering::Relaxed);
    let result = match body_bytes(body) {
        Ok(b) => chat_job(&st, &b).await,
        Err(e) => Err(e),
    };
    respond(st, result).await
}

/// `POST /v1/completions`.
pub async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    st.metrics
        .completion_requests
        .fetch_add(1, Ordering::Relaxed);
    let result = match body_bytes(body) {
        Ok(b) => completion_job(&st, &b).await,
        Err(e) => Err(e),
    };
    respond(st, result).await
}

fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::with_status(status, "the request body is too large").code("body_too_large")
        } else {
            ApiError::with_status(status, format!("could not read the request body: {e}"))
        }
    })
}

async fn respond(st: Arc<AppState>, job: Result<Job, ApiError>) -> Response {
    let started = Instant::now();
    let result = job.and_then(|job| {
        let run = submit(&st, &job)?;
        Ok((job, run))
    });
    match result {
        Ok((job, run)) if job.stream => stream(st, job, run, started),
        Ok((job, run)) => collect(st, job, run, started).await,
        Err(e) => error_response(&st, e),
    }
}

/// Checks the fields both endpoints share; returns the sampling settings and `n`.
fn common(st: &AppState, c: &Common) -> Result<(SamplingParams, usize), ApiError> {
    if c.model != st.model_id {
        return Err(ApiError::with_status(
            StatusCode::NOT_FOUND,
            format!(
                "the model '{}' does not exist; this server serves '{}'",
                c.model, st.model_id
            ),
        )
        .param("model")
        .code("model_not_found"));
    }
    let n = c.n.unwrap_or(1);
    if n == 0 || n > MAX_N {
        return Err(
            ApiError::invalid(format!("n must be between 1 and {MAX_N}, got {n}")).param("n"),
        );
    }
    let top_k = match c.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        k => {
            return Err(
                ApiError::invalid(format!("top_k must be -1, 0 or positive, got {k}"))
                    .param("top_k"),
            );
        }
    };
    let sampling = SamplingParams {
        temperature: c.temperature.unwrap_or(1.0),
        top_k,
        top_p: c.top_p.unwrap_or(1.0),
        min_p: c.min_p.unwrap_or(0.0),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        // Negative seeds are valid in OpenAI's API: keep their bits.
        seed: c.seed.map(|s| s as u64),
    };
    sampling.validate().map_err(sampling_error)?;
    Ok((sampling, n as usize))
}

fn sampling_error(e: SamplingError) -> ApiError {
    let param = match &e {
        SamplingError::InvalidParam { name, .. } => Some(*name),
        _ => None,
    };
    let err = ApiError::invalid(e.to_string());
    match param {
        Some(p) => err.param(p),
        None => err,
    }
}

/// The generation limit of one prompt: the request's `max_tokens` if it fits the context,
/// else the room left (chat) or 16 tokens (completions, OpenAI's default).
fn max_tokens(
    requested: Option<u64>,
    default: Option<usize>,
    prompt: usize,
    ctx: usize,
    prompt_param: &str,
) -> Result<usize, ApiError> {
    if prompt >= ctx {
        return Err(ApiError::invalid(format!(
            "this model's maximum context length is {ctx} tokens, but the prompt has {prompt} tokens"
        ))
        .param(prompt_param)
        .code("context_length_exceeded"));
    }
    let room = ctx - prompt;
    match requested {
        Some(0) => Err(ApiError::invalid("max_tokens must be at least 1").param("max_tokens")),
        Some(m) if m > room as u64 => Err(ApiError::invalid(format!(
            "this model's maximum context length is {ctx} tokens; the prompt has {prompt} tokens, so at most {room} can be generated, but max_tokens is {m}"
        ))
        .param("max_tokens")
        .code("context_length_exceeded")),
        Some(m) => Ok(m as usize),
        None => Ok(default.map_or(room, |d| d.min(room))),
    }
}

async fn chat_job(st: &Arc<AppState>, body: &[u8]) -> Result<Job, ApiError> {
    let (common_fields, req): (Common, ChatRequest) =
        api::parse(body, &["messages", "max_completion_tokens", "top_logprobs"])?;
    let (sampling, n) = common(st, &common_fields)?;
    let grammar = structured::grammar(st, &common_fields).await?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty").param("messages"));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.into_iter().enumerate() {
        if !matches!(
            m.role.as_str(),
            "system" | "developer" | "user" | "assistant" | "tool"
        ) {
            return Err(ApiError::invalid(format!(
                "unknown role '{}': expected system, developer, user, assistant or tool",
                m.role
            ))
            .param(format!("messages[{i}].role")));
        }
        let role = if m.role == "developer" {
            "system".to_string()
        } else {
            m.role
        };
        messages.push(ChatMessage::new(role, api::content_text(m.content, i)?));
    }
    let top_logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (false, Some(t)) if t > 0 => {
            return Err(
                ApiError::invalid("top_logprobs requires logprobs to be true")
                    .param("top_logprobs"),
            );
        }
        (false, _) => None,
        (true, t) => Some(top_logprobs_count(t.unwrap_or(0), "top_logprobs")?),
    };
    let engine = Arc::clone(&st.engine);
    // Templates and tokenizers take time on long inputs: off the async workers.
    let prompt = tokio::task::spawn_blocking(move || engine.chat_prompt(&messages))
        .await
        .map_err(|e| {
            tracing::error!("chat template task failed: {e}");
            ApiError::internal()
        })?
        .map_err(|e| {
            ApiError::invalid(format!("the messages cannot be formatted: {e}")).param("messages")
        })?;
    let ctx = st.scheduler.config().ctx_size;
    let limit = req.max_completion_tokens.or(common_fields.max_tokens);
    let max = max_tokens(limit, None, prompt.len(), ctx, "messages")?;
    Ok(Job {
        kind: Kind::Chat,
        prompts: vec![prompt],
        max_tokens: vec![max],
        n,
        sampling,
        include_usage: include_usage(&common_fields),
        ignore_eos: common_fields.ignore_eos.unwrap_or(false),
        stream: common_fields.stream.unwrap_or(false),
        stop: api::stop_strings(common_fields.stop)?,
        top_logprobs,
        grammar,
    })
}

fn include_usage(c: &Common) -> bool {
    c.stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false)
}

fn top_logprobs_count(t: u32, param: &str) -> Result<usize, ApiError> {
    if t > MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid(format!(
            "{param} must be between 0 and {MAX_TOP_LOGPROBS}, got {t}"
        ))
        .param(param));
    }
    Ok(t as usize)
}

async fn completion_job(st: &Arc<AppState>, body: &[u8]) -> Result<Job, ApiError> {
    let (common_fields, req): (Common, CompletionRequest) =
        api::parse(body, &["prompt", "echo", "suffix", "best_of"])?;
    let (sampling, n) = common(st, &common_fields)?;
    let grammar = structured::grammar(st, &common_fields).await?;
    if req.echo == Some(true) {
        return Err(ApiError::invalid("echo is not supported").param("echo"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix is not supported").param("suffix"));
    }
    if req.best_of.is_some_and(|b| b as usize != n) {
        return Err(ApiError::invalid("best_of is only supported equal to n").param("best_of"));
    }
    let top_logprobs = req
        .logprobs
        .map(|t| top_logprobs_count(t, "logprobs"))
        .transpose()?;
    let vocab = st.engine.model.config.vocab_size;
    let prompts = match req.prompt {
        Prompt::Tokens(t) => vec![t],
        Prompt::TokenLists(l) => l,
        Prompt::Text(t) => vec![encode(st, t).await?],
        Prompt::Texts(ts) => {
            let mut v = Vec::with_capacity(ts.len());
            for t in ts {
                v.push(encode(st, t).await?);
            }
            v
        }
    };
    if prompts.is_empty() || prompts.len() * n > MAX_N as usize {
        return Err(ApiError::invalid(format!(
            "between 1 and {MAX_N} prompts times n are supported, got {} prompts and n = {n}",
            prompts.len()
        ))
        .param("prompt"));
    }
    let ctx = st.scheduler.config().ctx_size;
    let mut limits = Vec::with_capacity(prompts.len());
    for p in &prompts {
        if p.is_empty() {
            return Err(ApiError::invalid("the prompt is empty").param("prompt"));
        }
        if let Some(&bad) = p.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid(format!(
                "token id {bad} is outside the vocabulary of {vocab} tokens"
            ))
            .param("prompt"));
        }
        limits.push(max_tokens(
            common_fields.max_tokens,
            Some(16),
            p.len(),
            ctx,
            "prompt",
        )?);
    }
    Ok(Job {
        kind: Kind::Completion,
        prompts,
        max_tokens: limits,
        n,
        sampling,
        include_usage: include_usage(&common_fields),
        ignore_eos: common_fields.ignore_eos.unwrap_or(false),
        stream: common_fields.stream.unwrap_or(false),
        stop: api::stop_strings(common_fields.stop)?,
        top_logprobs,
        grammar,
    })
}

async fn encode(st: &Arc<AppState>, text: String) -> Result<Vec<u32>, ApiError> {
    let engine = Arc::clone(&st.engine);
    tokio::task::spawn_blocking(move || engine.text_prompt(&text))
        .await
        .map_err(|e| {
            tracing::error!("tokenizer task failed: {e}");
            ApiError::internal()
        })?
        .map_err(|e| {
            ApiError::invalid(format!("the prompt cannot be tokenized: {e}")).param("prompt")
        })
}

/// Sends one sequence's events, tagged with its choice index, into the request's channel.
struct ChannelSink {
    index: usize,
    tx: UnboundedSender<(usize, Event)>,
}

impl EventSink for ChannelSink {
    fn send(&mut self, event: Event) -> bool {
        self.tx.send((self.index, event)).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Cancels a request's sequences when dropped (finished ones are ignored by the scheduler).
struct CancelGuard {
    scheduler: Arc<Scheduler>,
    ids: Vec<SeqId>,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        for &id in &self.ids {
            self.scheduler.cancel(id);
        }
    }
}

/// A submitted request.
struct Running {
    rx: UnboundedReceiver<(usize, Event)>,
    _guard: CancelGuard,
    choices: usize,
}

fn submit(st: &AppState, job: &Job) -> Result<Running, ApiError> {
    let (tx, rx) = unbounded_channel();
    let mut guard = CancelGuard {
        scheduler: Arc::clone(&st.scheduler),
        ids: Vec::new(),
    };
    for (p, (prompt, &max_tokens)) in job.prompts.iter().zip(&job.max_tokens).enumerate() {
        for j in 0..job.n {
            let mut sampling = job.sampling.clone();
            // Distinct but reproducible choices under one seed.
            sampling.seed = sampling.seed.map(|s| s.wrapping_add(j as u64));
            let req = GenRequest {
                prompt: prompt.clone(),
                max_tokens,
                sampling,
                stop: job.stop.clone(),
                top_logprobs: job.top_logprobs,
                ignore_eos: job.ignore_eos,
                grammar: job.grammar.clone(),
            };
            let sink = ChannelSink {
                index: p * job.n + j,
                tx: tx.clone(),
            };
            let id = st
                .scheduler
                .submit(req, Box::new(sink))
                .map_err(scheduler_error)?;
            guard.ids.push(id);
        }
    }
    let prompt_tokens: usize = job.prompts.iter().map(Vec::len).sum();
    st.metrics
        .prompt_tokens
        .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    Ok(Running {
        rx,
        _guard: guard,
        choices: job.prompts.len() * job.n,
    })
}

fn scheduler_error(e: SchedulerError) -> ApiError {
    match e {
        SchedulerError::QueueFull { .. } => {
            ApiError::with_status(StatusCode::TOO_MANY_REQUESTS, e.to_string()).code("queue_full")
        }
        SchedulerError::ShuttingDown => {
            ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
        SchedulerError::PromptTooLong { .. } => ApiError::invalid(e.to_string())
            .param("prompt")
            .code("context_length_exceeded"),
        SchedulerError::ZeroMaxTokens => ApiError::invalid(e.to_string()).param("max_tokens"),
        SchedulerError::EmptyStop { .. } => ApiError::invalid(e.to_string()).param("stop"),
        SchedulerError::Sampling(s) => sampling_error(s),
        SchedulerError::EmptyPrompt => ApiError::invalid(e.to_string()).param("prompt"),
    }
}

/// OpenAI's name of a finish reason.
fn finish_name(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
    }
}

/// Log-probabilities must be finite in JSON; vLLM reports -9999 for impossible tokens.
fn finite(lp: f32) -> f32 {
    if lp.is_finite() { lp } else { -9999.0 }
}

/// Accumulates one request's output and renders it as OpenAI JSON.
struct Output {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    st: Arc<AppState>,
    started: Instant,
    first_token: bool,
    last_token: Vec<Option<Instant>>,
    choices: Vec<Choice>,
    /// Prompt and generated tokens, also read by the request's log line.
    tally: Arc<Tally>,
}

#[derive(Default)]
struct Choice {
    text: String,
    completion_tokens: usize,
    logprobs: Vec<Value>,
    /// Legacy completions' per-token arrays.
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top: Vec<Value>,
    offsets: Vec<usize>,
    finish: Option<&'static str>,
}

/// What one event means for the response.
enum Update {
    /// A token: (choice, text, logprobs JSON of this token for streaming).
    Token(usize, String, Option<Value>),
    /// The choice ended: (choice, last text, finish reason).
    Done(usize, String, &'static str),
    /// The choice failed (already logged).
    Failed,
}

impl Output {
    fn new(st: Arc<AppState>, job: &Job, choices: usize, started: Instant) -> Output {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let prefix = match job.kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        Output {
            kind: job.kind,
            id: format!("{prefix}-{:x}-{n}", st.created),
            created: crate::unix_now(),
            model: st.model_id.clone(),
            st,
            started,
            first_token: false,
            last_token: vec![None; choices],
            choices: (0..choices).map(|_| Choice::default()).collect(),
            tally: Tally::new(job.prompts.iter().map(Vec::len).sum()),
        }
    }

    fn token_str(&self, id: u32) -> String {
        self.st
            .engine
            .tokenizer
            .decode(&[id], false)
            .unwrap_or_default()
    }

    fn apply(&mut self, index: usize, event: Event) -> Update {
        match event {
            Event::Token { id, text, logprobs } => {
                let now = Instant::now();
                let m = &self.st.metrics;
                m.generated_tokens.fetch_add(1, Ordering::Relaxed);
                self.tally.token();
                if !self.first_token {
                    self.first_token = true;
                    m.ttft.observe(now - self.started);
                }
                if let Some(prev) = self.last_token[index].replace(now) {
                    m.itl.observe(now - prev);
                }
                let lp = logprobs.map(|l| self.logprobs_json(index, id, &l));
                let c = &mut self.choices[index];
                c.completion_tokens += 1;
                c.text.push_str(&text);
                Update::Token(index, text, lp)
            }
            Event::Done { finish, text, .. } => {
                let c = &mut self.choices[index];
                c.text.push_str(&text);
                let name = finish_name(&finish);
                c.finish = Some(name);
                Update::Done(index, text, name)
            }
            Event::Failed(msg) => {
                tracing::error!(request = %self.id, choice = index, "generation failed: {msg}");
                Update::Failed
            }
        }
    }

    /// Records a token's log-probabilities; returns them in the shape of one streamed
    /// chunk.
    fn logprobs_json(&mut self, index: usize, id: u32, l: &TokenLogprobs) -> Value {
        let token = self.token_str(id);
        let top: Vec<(String, f32)> = l
            .top
            .iter()
            .map(|&(t, lp)| (self.token_str(t), finite(lp)))
            .collect();
        let c = &mut self.choices[index];
        match self.kind {
            Kind::Chat => {
                let entry = json!({
                    "token": token,
                    "logprob": finite(l.logprob),
                    "bytes": token.as_bytes(),
                    "top_logprobs": top.iter().map(|(t, lp)| json!({
                        "token": t, "logprob": lp, "bytes": t.as_bytes(),
                    })).collect::<Vec<_>>(),
                });
                c.logprobs.push(entry.clone());
                json!({ "content": [entry] })
            }
            Kind::Completion => {
                let offset = c.text.len();
                let top_map: serde_json::Map<String, Value> =
                    top.into_iter().map(|(t, lp)| (t, json!(lp))).collect();
                c.tokens.push(token.clone());
                c.token_logprobs.push(finite(l.logprob));
                c.top.push(Value::Object(top_map.clone()));
                c.offsets.push(offset);
                json!({
                    "tokens": [token],
                    "token_logprobs": [finite(l.logprob)],
                    "top_logprobs": [top_map],
                    "text_offset": [offset],
                })
            }
        }
    }

    fn usage(&self) -> Value {
        let completion: usize = self.choices.iter().map(|c| c.completion_tokens).sum();
        json!({
            "prompt_tokens": self.tally.prompt,
            "completion_tokens": completion,
            "total_tokens": self.tally.prompt + completion,
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// The whole response of a non-streamed request.
    fn response(&self, want_logprobs: bool) -> Value {
        let choices: Vec<Value> = self
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| match self.kind {
                Kind::Chat => json!({
                    "index": i,
                    "message": { "role": "assistant", "content": c.text },
                    "logprobs": want_logprobs.then(|| json!({ "content": c.logprobs })),
                    "finish_reason": c.finish,
                }),
                Kind::Completion => json!({
                    "index": i,
                    "text": c.text,
                    "logprobs": want_logprobs.then(|| json!({
                        "tokens": c.tokens,
                        "token_logprobs": c.token_logprobs,
                        "top_logprobs": c.top,
                        "text_offset": c.offsets,
                    })),
                    "finish_reason": c.finish,
                }),
            })
            .collect();
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        })
    }

    /// One streamed chunk for one choice.
    fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        logprobs: Option<Value>,
        finish: Option<&str>,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({ "content": t }),
                    None => json!({}),
                };
                json!({ "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
            }
            Kind::Completion => json!({
                "index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish,
            }),
        };
        self.envelope(vec![choice])
    }

    fn envelope(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A non-streamed request: waits for every choice, then answers once.
async fn collect(st: Arc<AppState>, job: Job, mut run: Running, started: Instant) -> Response {
    let mut out = Output::new(Arc::clone(&st), &job, run.choices, started);
    let mut open = run.choices;
    while open > 0 {
        let Some((i, ev)) = run.rx.recv().await else {
            tracing::error!(request = %out.id, "scheduler dropped the request");
            return error_response(&st, ApiError::internal());
        };
        match out.apply(i, ev) {
            Update::Token(..) => {}
            Update::Done(..) => open -= 1,
            Update::Failed => return error_response(&st, ApiError::internal()),
        }
    }
    let res = crate::json_response(StatusCode::OK, &out.response(job.top_logprobs.is_some()));
    tagged(res, &out.tally)
}

fn error_response(st: &AppState, e: ApiError) -> Response {
    st.metrics.errors.fetch_add(1, Ordering::Relaxed);
    e.into_response()
}

fn stream(st: Arc<AppState>, job: Job, run: Running, started: Instant) -> Response {
    let out = Output::new(st, &job, run.choices, started);
    let tally = Arc::clone(&out.tally);
    let mut pending: VecDeque<SseEvent> = VecDeque::new();
    if job.kind == Kind::Chat {
        for i in 0..run.choices {
            let mut first = out.chunk(i, Some(""), None, None);
            first["choices"][0]["delta"]["role"] = json!("assistant");
            pending.push_back(data(&first));
        }
    }
    let state = StreamState {
        out,
        open: run.choices,
        run,
        pending,
        include_usage: job.include_usage,
        finished: false,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(ev) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(ev), s));
            }
            if s.finished {
                return None;
            }
            if s.open == 0 {
                if s.include_usage {
                    let mut last = s.out.envelope(Vec::new());
                    last["usage"] = s.out.usage();
                    s.pending.push_back(data(&last));
                }
                s.pending.push_back(SseEvent::default().data("[DONE]"));
                s.finished = true;
                continue;
            }
            let Some((i, ev)) = s.run.rx.recv().await else {
                tracing::error!(request = %s.out.id, "scheduler dropped the request");
                s.pending.push_back(data(&ApiError::internal().body()));
                s.finished = true;
                continue;
            };
            match s.out.apply(i, ev) {
                Update::Token(i, text, lp) => {
                    if !text.is_empty() || lp.is_some() {
                        let c = s.out.chunk(i, Some(&text), lp, None);
                        s.pending.push_back(data(&c));
                    }
                }
                Update::Done(i, text, finish) => {
                    s.open -= 1;
                    let text = (!text.is_empty()).then_some(text.as_str());
                    let c = s.out.chunk(i, text, None, Some(finish));
                    s.pending.push_back(data(&c));
                }
                Update::Failed => {
                    s.pending.push_back(data(&ApiError::internal().body()));
                    s.finished = true;
                }
            }
        }
    });
    let res = Sse::new(events).keep_alive(KeepAlive::default());
    tagged(res.into_response(), &tally)
}

struct StreamState {
    out: Output,
    run: Running,
    pending: VecDeque<SseEvent>,
    open: usize,
    include_usage: bool,
    finished: bool,
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}
