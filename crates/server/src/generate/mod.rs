//! The generation endpoints: turn a request into scheduler sequences (one per prompt and
//! choice), then collect their events into one JSON response or stream them as
//! server-sent events.
//!
//! `request` checks a body into a [`Job`], `response` accumulates the output and renders
//! OpenAI's JSON; this module submits, waits and streams.
//!
//! A key design decision made here is that both endpoints share one path and differ only
//! in a [`Kind`] that shapes the JSON: chat and legacy completions then cannot drift apart
//! in limits, accounting or cancellation.

mod request;
mod response;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use strata_runtime::scheduler::{Event, EventSink, GenRequest, Scheduler, SchedulerError, SeqId};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use self::request::{Job, Kind, chat_job, completion_job, sampling_error};
use self::response::{Output, Update};
use crate::AppState;
use crate::error::ApiError;
use crate::log::tagged;

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
                keep_special: job.keep_special.clone(),
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
            Update::Token { .. } => {}
            Update::Done { .. } => open -= 1,
            Update::Failed => return error_response(&st, ApiError::internal()),
        }
    }
    let body = out.response(job.top_logprobs.is_some());
    let res = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(body),
    )
        .into_response();
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
            pending.push_back(data(out.chunk(i, Some(""), None, true, None)));
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
                    s.pending.push_back(data(s.out.usage_chunk()));
                }
                s.pending.push_back(SseEvent::default().data("[DONE]"));
                s.finished = true;
                continue;
            }
            let Some((i, ev)) = s.run.rx.recv().await else {
                tracing::error!(request = %s.out.id, "scheduler dropped the request");
                s.pending
                    .push_back(data(ApiError::internal().body().to_string()));
                s.finished = true;
                continue;
            };
            s.push(i, ev);
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

impl StreamState {
    /// Queues the chunks of one event.
    fn push(&mut self, i: usize, ev: Event) {
        match self.out.apply(i, ev) {
            Update::Token {
                index,
                text,
                calls,
                logprobs,
            } => {
                if !text.is_empty() || logprobs.is_some() {
                    let c = self.out.chunk(index, Some(&text), logprobs, false, None);
                    self.pending.push_back(data(c));
                }
                self.calls(index, calls);
            }
            Update::Done {
                index,
                text,
                calls,
                finish,
            } => {
                self.open -= 1;
                let text = (!text.is_empty()).then_some(text.as_str());
                if calls.is_empty() {
                    let c = self.out.chunk(index, text, None, false, Some(finish));
                    self.pending.push_back(data(c));
                } else {
                    if text.is_some() {
                        let c = self.out.chunk(index, text, None, false, None);
                        self.pending.push_back(data(c));
                    }
                    self.calls(index, calls);
                    let c = self.out.chunk(index, None, None, false, Some(finish));
                    self.pending.push_back(data(c));
                }
            }
            Update::Failed => {
                self.pending
                    .push_back(data(ApiError::internal().body().to_string()));
                self.finished = true;
            }
        }
    }

    fn calls(&mut self, index: usize, calls: Vec<response::ToolCallDelta>) {
        for d in calls {
            self.pending.push_back(data(self.out.call_chunk(index, d)));
        }
    }
}

fn data(json: String) -> SseEvent {
    SseEvent::default().data(json)
}
