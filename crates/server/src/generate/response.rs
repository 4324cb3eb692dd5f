//! A request's output: events from the scheduler accumulated per choice and rendered as
//! OpenAI's JSON, whole or as streamed chunks, through typed response structs.
//!
//! A key design decision made here is that tool calls are read out of the text as it
//! arrives ([`ToolParser`] per choice): a streamed call goes out as `delta.tool_calls`
//! pieces as the model writes it (its id and name, then its arguments piece by piece), and
//! the non-streamed response holds exactly the calls those pieces add up to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;
use serde_json::{Map, Value};
use strata_runtime::engine::FinishReason;
use strata_runtime::scheduler::{Event, TokenLogprobs};
use strata_runtime::text::tools::{ToolEvent, ToolParser};

use super::request::{Job, Kind};
use crate::AppState;
use crate::log::Tally;
use crate::tools::call_id;

/// `usage`.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct PromptDetails {
    /// Prompt tokens whose KV rows came from the prefix cache.
    cached_tokens: usize,
}

/// A response or a streamed chunk.
#[derive(Debug, Serialize)]
pub(super) struct Envelope<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

/// One choice of a whole response.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum ResponseChoice<'a> {
    Chat {
        index: usize,
        message: AssistantMessage<'a>,
        logprobs: Option<ChatLogprobs<'a>>,
        finish_reason: Option<&'static str>,
    },
    Completion {
        index: usize,
        text: &'a str,
        logprobs: Option<CompletionLogprobs<'a>>,
        finish_reason: Option<&'static str>,
    },
}

/// The assistant's message: its text (null when it only called tools) and its calls.
#[derive(Debug, Serialize)]
pub(super) struct AssistantMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tool_calls: &'a [ToolCallOut],
}

/// A call in a response.
#[derive(Debug, Serialize)]
pub(super) struct ToolCallOut {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionOut,
}

/// The function of a [`ToolCallOut`].
#[derive(Debug, Serialize)]
pub(super) struct FunctionOut {
    name: String,
    arguments: String,
}

/// Chat log-probabilities.
#[derive(Debug, Serialize)]
pub(super) struct ChatLogprobs<'a> {
    content: &'a [TokenLogprob],
}

/// One token's log-probability and its alternatives (chat).
#[derive(Debug, Clone, Serialize)]
pub(super) struct TokenLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
    top_logprobs: Vec<TopLogprob>,
}

/// An alternative token (chat).
#[derive(Debug, Clone, Serialize)]
pub(super) struct TopLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
}

/// Legacy completions' log-probabilities: parallel arrays.
#[derive(Debug, Serialize)]
pub(super) struct CompletionLogprobs<'a> {
    tokens: &'a [String],
    token_logprobs: &'a [f32],
    top_logprobs: &'a [Map<String, Value>],
    text_offset: &'a [usize],
}

/// One streamed choice.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum ChunkChoice<'a> {
    Chat {
        index: usize,
        delta: Delta<'a>,
        logprobs: Option<ChunkLogprobs>,
        finish_reason: Option<&'static str>,
    },
    Completion {
        index: usize,
        text: &'a str,
        logprobs: Option<ChunkLogprobs>,
        finish_reason: Option<&'static str>,
    },
}

/// What a chat chunk adds to the message.
#[derive(Debug, Default, Serialize)]
pub(super) struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCallDelta>,
}

/// A streamed piece of a call: the first names it (arguments empty), the next carry pieces
/// of its arguments.
#[derive(Debug, Serialize)]
pub(super) struct ToolCallDelta {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Serialize)]
pub(super) struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    arguments: String,
}

/// One token's log-probabilities in a chunk.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum ChunkLogprobs {
    Chat {
        content: [TokenLogprob; 1],
    },
    Completion {
        tokens: [String; 1],
        token_logprobs: [f32; 1],
        top_logprobs: [Map<String, Value>; 1],
        text_offset: [usize; 1],
    },
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
pub(super) struct Output {
    kind: Kind,
    pub id: String,
    created: u64,
    model: String,
    st: Arc<AppState>,
    started: Instant,
    first_token: bool,
    last_token: Vec<Option<Instant>>,
    choices: Vec<Choice>,
    /// Choices per prompt (`n`).
    per_prompt: usize,
    /// Prompt and generated tokens, also read by the request's log line.
    pub tally: Arc<Tally>,
}

struct Choice {
    /// The message's content (tool calls taken out).
    text: String,
    calls: Vec<ToolCallOut>,
    parser: Option<ToolParser>,
    completion_tokens: usize,
    /// Prompt tokens this choice's sequence took from the prefix cache.
    cached_tokens: usize,
    logprobs: Vec<TokenLogprob>,
    /// Legacy completions' per-token arrays.
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top: Vec<Map<String, Value>>,
    offsets: Vec<usize>,
    finish: Option<&'static str>,
}

/// What one event means for the response.
pub(super) enum Update {
    /// A token: its text for the content, what it adds to the choice's calls and its
    /// log-probabilities for streaming.
    Token {
        index: usize,
        text: String,
        calls: Vec<ToolCallDelta>,
        logprobs: Option<ChunkLogprobs>,
    },
    /// The choice ended: its last text and call pieces, and the finish reason.
    Done {
        index: usize,
        text: String,
        calls: Vec<ToolCallDelta>,
        finish: &'static str,
    },
    /// The choice failed (already logged).
    Failed,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl Output {
    pub fn new(st: Arc<AppState>, job: &Job, choices: usize, started: Instant) -> Output {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let prefix = match job.kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        let choice = || Choice {
            text: String::new(),
            calls: Vec::new(),
            parser: job
                .tools
                .as_ref()
                .map(|t| ToolParser::new(t.format, &t.specs)),
            completion_tokens: 0,
            cached_tokens: 0,
            logprobs: Vec::new(),
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top: Vec::new(),
            offsets: Vec::new(),
            finish: None,
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
            choices: (0..choices).map(|_| choice()).collect(),
            per_prompt: job.n.max(1),
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

    pub fn apply(&mut self, index: usize, event: Event) -> Update {
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
                let lp = logprobs.map(|l| self.logprobs(index, id, &l));
                self.choices[index].completion_tokens += 1;
                let (text, calls) = self.take_text(index, &text, false);
                Update::Token {
                    index,
                    text,
                    calls,
                    logprobs: lp,
                }
            }
            Event::Done {
                finish,
                text,
                cached_tokens,
                ..
            } => {
                let (text, calls) = self.take_text(index, &text, true);
                let c = &mut self.choices[index];
                c.cached_tokens = cached_tokens;
                let name = match finish_name(&finish) {
                    "stop" if !c.calls.is_empty() => "tool_calls",
                    name => name,
                };
                c.finish = Some(name);
                Update::Done {
                    index,
                    text,
                    calls,
                    finish: name,
                }
            }
            Event::Failed(msg) => {
                tracing::error!(request = %self.id, choice = index, "generation failed: {msg}");
                Update::Failed
            }
        }
    }

    /// Adds generated text to a choice: returns the part that is content and what it adds
    /// to the calls; with `last`, the choice's text ends here.
    fn take_text(&mut self, index: usize, text: &str, last: bool) -> (String, Vec<ToolCallDelta>) {
        let created = self.st.created;
        let c = &mut self.choices[index];
        let Some(parser) = c.parser.as_mut() else {
            c.text.push_str(text);
            return (text.to_string(), Vec::new());
        };
        let mut events = parser.push(text);
        if last {
            events.extend(parser.finish());
        }
        let mut content = String::new();
        let mut deltas: Vec<ToolCallDelta> = Vec::new();
        for e in events {
            match e {
                ToolEvent::Text(t) => content.push_str(&t),
                ToolEvent::CallStart(name) => {
                    let id = call_id(created);
                    deltas.push(ToolCallDelta {
                        index: c.calls.len(),
                        id: Some(id.clone()),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(name.clone()),
                            arguments: String::new(),
                        },
                    });
                    c.calls.push(ToolCallOut {
                        id,
                        kind: "function",
                        function: FunctionOut {
                            name,
                            arguments: String::new(),
                        },
                    });
                }
                ToolEvent::Arguments(piece) => {
                    // The parser starts a call before its arguments.
                    let Some(call) = c.calls.last_mut() else {
                        continue;
                    };
                    call.function.arguments.push_str(&piece);
                    let index = c.calls.len() - 1;
                    // Pieces of one token go out together; the naming delta stays first.
                    match deltas.last_mut() {
                        Some(d) if d.index == index && d.id.is_none() => {
                            d.function.arguments.push_str(&piece);
                        }
                        _ => deltas.push(ToolCallDelta {
                            index,
                            id: None,
                            kind: None,
                            function: FunctionDelta {
                                name: None,
                                arguments: piece,
                            },
                        }),
                    }
                }
            }
        }
        c.text.push_str(&content);
        (content, deltas)
    }

    /// Records a token's log-probabilities; returns them in the shape of one streamed
    /// chunk.
    fn logprobs(&mut self, index: usize, id: u32, l: &TokenLogprobs) -> ChunkLogprobs {
        let token = self.token_str(id);
        let top: Vec<(String, f32)> = l
            .top
            .iter()
            .map(|&(t, lp)| (self.token_str(t), finite(lp)))
            .collect();
        let c = &mut self.choices[index];
        match self.kind {
            Kind::Chat => {
                let entry = TokenLogprob {
                    bytes: token.as_bytes().to_vec(),
                    token,
                    logprob: finite(l.logprob),
                    top_logprobs: top
                        .into_iter()
                        .map(|(t, lp)| TopLogprob {
                            bytes: t.as_bytes().to_vec(),
                            token: t,
                            logprob: lp,
                        })
                        .collect(),
                };
                c.logprobs.push(entry.clone());
                ChunkLogprobs::Chat { content: [entry] }
            }
            Kind::Completion => {
                let offset = c.text.len();
                let top_map: Map<String, Value> = top
                    .into_iter()
                    .map(|(t, lp)| (t, Value::from(lp)))
                    .collect();
                c.tokens.push(token.clone());
                c.token_logprobs.push(finite(l.logprob));
                c.top.push(top_map.clone());
                c.offsets.push(offset);
                ChunkLogprobs::Completion {
                    tokens: [token],
                    token_logprobs: [finite(l.logprob)],
                    top_logprobs: [top_map],
                    text_offset: [offset],
                }
            }
        }
    }

    pub fn usage(&self) -> Usage {
        let completion: usize = self.choices.iter().map(|c| c.completion_tokens).sum();
        Usage {
            prompt_tokens: self.tally.prompt,
            completion_tokens: completion,
            total_tokens: self.tally.prompt + completion,
            prompt_tokens_details: PromptDetails {
                cached_tokens: self.cached_tokens(),
            },
        }
    }

    /// Prompt tokens served from the prefix cache: as `prompt_tokens` counts each prompt
    /// once, a prompt with `n` choices counts what all of them took from the cache.
    fn cached_tokens(&self) -> usize {
        self.choices
            .chunks(self.per_prompt)
            .map(|c| c.iter().map(|c| c.cached_tokens).min().unwrap_or(0))
            .sum()
    }

    fn envelope<C>(&self, chunk: bool, choices: Vec<C>, usage: Option<Usage>) -> Envelope<'_, C> {
        let object = match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        };
        Envelope {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices,
            usage,
        }
    }

    /// The whole response of a non-streamed request, as JSON text.
    pub fn response(&self, want_logprobs: bool) -> String {
        let choices: Vec<ResponseChoice<'_>> = self
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| match self.kind {
                Kind::Chat => ResponseChoice::Chat {
                    index: i,
                    message: AssistantMessage {
                        role: "assistant",
                        content: (c.calls.is_empty() || !c.text.is_empty())
                            .then_some(c.text.as_str()),
                        tool_calls: &c.calls,
                    },
                    logprobs: want_logprobs.then_some(ChatLogprobs {
                        content: &c.logprobs,
                    }),
                    finish_reason: c.finish,
                },
                Kind::Completion => ResponseChoice::Completion {
                    index: i,
                    text: &c.text,
                    logprobs: want_logprobs.then_some(CompletionLogprobs {
                        tokens: &c.tokens,
                        token_logprobs: &c.token_logprobs,
                        top_logprobs: &c.top,
                        text_offset: &c.offsets,
                    }),
                    finish_reason: c.finish,
                },
            })
            .collect();
        to_json(&self.envelope(false, choices, Some(self.usage())))
    }

    /// One streamed chunk for one choice: text (chat: `None` sends an empty delta),
    /// log-probabilities, the first chunk's role, and the finish reason.
    pub fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        logprobs: Option<ChunkLogprobs>,
        first: bool,
        finish: Option<&'static str>,
    ) -> String {
        let choice = match self.kind {
            Kind::Chat => ChunkChoice::Chat {
                index,
                delta: Delta {
                    content: text,
                    role: first.then_some("assistant"),
                    tool_calls: Vec::new(),
                },
                logprobs,
                finish_reason: finish,
            },
            Kind::Completion => ChunkChoice::Completion {
                index,
                text: text.unwrap_or(""),
                logprobs,
                finish_reason: finish,
            },
        };
        to_json(&self.envelope(true, vec![choice], None))
    }

    /// The chunk of one piece of a call.
    pub fn call_chunk(&self, index: usize, delta: ToolCallDelta) -> String {
        let choice = ChunkChoice::Chat {
            index,
            delta: Delta {
                tool_calls: vec![delta],
                ..Delta::default()
            },
            logprobs: None,
            finish_reason: None,
        };
        to_json(&self.envelope(true, vec![choice], None))
    }

    /// The last chunk of a stream with `include_usage`: no choices, the usage.
    pub fn usage_chunk(&self) -> String {
        to_json(&self.envelope::<ChunkChoice<'_>>(true, Vec::new(), Some(self.usage())))
    }
}

fn to_json<T: Serialize>(v: &T) -> String {
    // Our structs hold only strings, numbers and maps with string keys: this cannot fail.
    serde_json::to_string(v).unwrap_or_else(|e| {
        tracing::error!("serializing a response failed: {e}");
        String::from("{}")
    })
}
