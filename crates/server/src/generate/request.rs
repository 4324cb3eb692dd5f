//! A request body checked into a [`Job`]: sampling settings, limits, prompts (a chat
//! rendered through its template, with its tools), and the grammar that constrains it.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Map, Value, json};
use strata_runtime::grammar::Grammar;
use strata_runtime::sampling::{SamplingError, SamplingParams};

use crate::AppState;
use crate::api::{
    self, CHAT_FIELDS, ChatRequest, Common, CompletionRequest, MAX_N, MAX_TOP_LOGPROBS, Message,
    Prompt,
};
use crate::error::ApiError;
use crate::structured;
use crate::tools::{self, CallParsing, Choice};

/// Which endpoint: shapes the response JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Completion,
}

/// A checked request, ready to submit.
pub(super) struct Job {
    pub kind: Kind,
    pub prompts: Vec<Vec<u32>>,
    /// Per prompt.
    pub max_tokens: Vec<usize>,
    pub n: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub top_logprobs: Option<usize>,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// The compiled `response_format` or tool-call grammar, cloned into each choice.
    pub grammar: Option<Grammar>,
    /// How to read tool calls out of the output (`None`: no tools, or `tool_choice` none).
    pub tools: Option<CallParsing>,
    /// The special ids that parsing reads and decoding must keep in the text.
    pub keep_special: Vec<u32>,
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

pub(super) fn sampling_error(e: SamplingError) -> ApiError {
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

/// The conversation as the JSON messages templates read, checked; `developer` becomes
/// `system`.
fn chat_messages(messages: Vec<Message>) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty").param("messages"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown role '{}': expected system, developer, user, assistant or tool",
                    m.role
                ))
                .param(format!("messages[{i}].role")));
            }
        };
        let mut msg = Map::new();
        msg.insert("role".into(), json!(role));
        let has_calls = m.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
        let content = match m.content {
            None if has_calls => Value::Null,
            c => Value::String(api::content_text(c, i)?),
        };
        msg.insert("content".into(), content);
        if let Some(calls) = m.tool_calls {
            if role != "assistant" {
                return Err(ApiError::invalid(format!(
                    "only assistant messages have tool_calls, this one is '{role}'"
                ))
                .param(format!("messages[{i}].tool_calls")));
            }
            let mut list = Vec::with_capacity(calls.len());
            for (j, c) in calls.into_iter().enumerate() {
                let at = format!("messages[{i}].tool_calls[{j}]");
                if c.kind.as_deref().is_some_and(|k| k != "function") {
                    return Err(ApiError::invalid(format!("{at}.type must be 'function'"))
                        .param(format!("{at}.type")));
                }
                if !serde_json::from_str::<Value>(&c.function.arguments)
                    .is_ok_and(|v| v.is_object())
                {
                    return Err(ApiError::invalid(format!(
                        "{at}.function.arguments must be a JSON object as a string"
                    ))
                    .param(format!("{at}.function.arguments")));
                }
                list.push(json!({"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": c.function.arguments}}));
            }
            msg.insert("tool_calls".into(), Value::Array(list));
        }
        match (role, m.tool_call_id) {
            ("tool", Some(id)) => {
                msg.insert("tool_call_id".into(), json!(id));
            }
            ("tool", None) => {
                return Err(
                    ApiError::invalid("a tool message needs the tool_call_id it answers")
                        .param(format!("messages[{i}].tool_call_id")),
                );
            }
            _ => {}
        }
        if let Some(name) = m.name {
            msg.insert("name".into(), json!(name));
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

pub(super) async fn chat_job(st: &Arc<AppState>, body: &[u8]) -> Result<Job, ApiError> {
    let (common_fields, req): (Common, ChatRequest) = api::parse(body, CHAT_FIELDS)?;
    let (sampling, n) = common(st, &common_fields)?;
    let tool_req = tools::tool_request(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let constrained = matches!(tool_req.choice, Choice::Required | Choice::Named(_));
    if constrained
        && common_fields
            .response_format
            .as_ref()
            .is_some_and(|f| !f.is_null())
    {
        return Err(ApiError::invalid(
            "response_format cannot be combined with a tool_choice that forces a call",
        )
        .param("response_format"));
    }
    let format_grammar = structured::grammar(st, &common_fields).await?;
    let messages = chat_messages(req.messages)?;
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
    let own_template = req.chat_template.is_some();
    let source = tools::template_source(st, req.chat_template)?;
    let state = Arc::clone(st);
    // Templates and tokenizers take time on long inputs: off the async workers.
    let (prompt, format, tool_req) = tokio::task::spawn_blocking(move || {
        tools::render(&state, source.as_deref(), own_template, messages, &tool_req)
            .map(|(p, f)| (p, f, tool_req))
    })
    .await
    .map_err(|e| {
        tracing::error!("chat template task failed: {e}");
        ApiError::internal()
    })?
    .map_err(|e| {
        let param = if own_template {
            "chat_template"
        } else {
            "messages"
        };
        ApiError::invalid(format!("the messages cannot be formatted: {e}")).param(param)
    })?;
    // A response format constrains the whole output, which leaves `auto` no room for a
    // lazy call grammar.
    let grammar = match format_grammar {
        Some(g) if tool_req.choice == Choice::Auto => Some(g),
        _ => tools::grammar(st, &tool_req, format)
            .await?
            .or(format_grammar),
    };
    let ctx = st.scheduler.config().ctx_size;
    let limit = req.max_completion_tokens.or(common_fields.max_tokens);
    let max = max_tokens(limit, None, prompt.len(), ctx, "messages")?;
    let parsing = (tool_req.choice != Choice::None).then(|| CallParsing {
        format,
        specs: tool_req.specs,
    });
    let keep_special = match &parsing {
        Some(p) => p
            .format
            .markers()
            .iter()
            .filter_map(|m| st.engine.tokenizer.special_token_id(m))
            .collect(),
        None => Vec::new(),
    };
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
        tools: parsing,
        keep_special,
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

pub(super) async fn completion_job(st: &Arc<AppState>, body: &[u8]) -> Result<Job, ApiError> {
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
    let vocab = st.engine.model.config().vocab_size;
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
        tools: None,
        keep_special: Vec::new(),
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
