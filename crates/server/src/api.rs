//! Request bodies of the OpenAI API, parsed and checked into what the scheduler takes.
//!
//! A key design decision made here is to reject unknown top-level fields (as OpenAI does)
//! and to name the parameter at fault in every error: a typo such as `max_token` silently
//! ignored would cost the client far more than a 400.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;

/// Fields every generation endpoint accepts.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "response_format",
    "user",
    "store",
    "metadata",
    "service_tier",
];

/// Most choices per request (`n`).
pub const MAX_N: u32 = 16;
/// Most stop strings.
const MAX_STOP: usize = 16;
/// Most alternatives per token in log-probabilities.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The sampling and limit fields shared by both endpoints.
#[derive(Debug, Deserialize)]
pub struct Common {
    /// Model id.
    pub model: String,
    /// Most tokens to generate per choice.
    pub max_tokens: Option<u64>,
    /// Temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k (0 or -1: off).
    pub top_k: Option<i64>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Seed.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty (vLLM's extension).
    pub repetition_penalty: Option<f32>,
    /// Generate past end-of-sequence tokens (vLLM's extension, for benchmarks).
    pub ignore_eos: Option<bool>,
    /// Choices per prompt.
    pub n: Option<u32>,
    /// Stream with server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Structured output: checked by [`crate::structured`], which names the field at fault.
    pub response_format: Option<Value>,
}

/// Content of a chat message: text or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Typed parts; only `text` parts are supported.
    Parts(Vec<Part>),
}

/// One content part.
#[derive(Debug, Deserialize)]
pub struct Part {
    /// Part type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its text.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// Its content.
    pub content: Option<Content>,
    /// The calls an assistant message made.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
    /// The author's name.
    pub name: Option<String>,
}

/// A call in an assistant message of the history.
#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    /// The call's id.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The function called.
    pub function: FunctionCallIn,
}

/// The function of a [`ToolCallIn`].
#[derive(Debug, Deserialize)]
pub struct FunctionCallIn {
    /// Its name.
    pub name: String,
    /// Its arguments, a JSON object as text.
    pub arguments: String,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// `max_tokens`' newer name.
    pub max_completion_tokens: Option<u64>,
    /// Return log-probabilities.
    pub logprobs: Option<bool>,
    /// Alternatives per token.
    pub top_logprobs: Option<u32>,
    /// Tools the model may call: checked by [`crate::tools`], which names the field at fault.
    pub tools: Option<Value>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<Value>,
    /// Whether several calls may come in one turn.
    pub parallel_tool_calls: Option<bool>,
    /// A Jinja chat template to render this request with instead of the model's (vLLM's
    /// extension).
    pub chat_template: Option<String>,
}

/// The top-level fields of a chat request besides the common ones.
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template",
];

/// `prompt` of a completion: text, texts, token ids or lists of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One token list.
    Tokens(Vec<u32>),
    /// Several token lists.
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt(s).
    pub prompt: Prompt,
    /// Alternatives per token (the legacy API's integer `logprobs`).
    pub logprobs: Option<u32>,
    /// Echo the prompt (only `false` is supported).
    pub echo: Option<bool>,
    /// Text after the completion (not supported).
    pub suffix: Option<String>,
    /// Candidates to rank (only `best_of` = `n` is supported).
    pub best_of: Option<u32>,
}

/// Parses a JSON body into the shared fields and the endpoint's own `T`, allowing only
/// `COMMON_FIELDS` and `extra` at the top level. (Two passes over one value instead of
/// `#[serde(flatten)]`, which would lose the path of a field's error.)
pub fn parse<T: DeserializeOwned>(body: &[u8], extra: &[&str]) -> Result<(Common, T), ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(format!("the request body is not valid JSON: {e}")).code("invalid_json")
    })?;
    let Some(obj) = value.as_object() else {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    };
    // The streaming flag lives in `Common` and `logprobs` differs per endpoint, so
    // `logprobs` appears in both lists; that is harmless.
    if let Some(k) = obj
        .keys()
        .find(|k| !COMMON_FIELDS.contains(&k.as_str()) && !extra.contains(&k.as_str()))
    {
        return Err(
            ApiError::invalid(format!("unrecognized request argument supplied: {k}"))
                .param(k.clone()),
        );
    }
    Ok((from_value(&value)?, from_value(&value)?))
}

fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let err = ApiError::invalid(format!("invalid value for '{path}': {inner}"));
        if path == "." { err } else { err.param(path) }
    })
}

/// The stop strings, checked.
pub fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let stop = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > MAX_STOP {
        return Err(ApiError::invalid(format!(
            "at most {MAX_STOP} stop strings are supported, got {}",
            stop.len()
        ))
        .param("stop"));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop strings must not be empty").param("stop"));
    }
    Ok(stop)
}

/// The text of a message's content.
pub fn content_text(content: Option<Content>, index: usize) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(t)) => Ok(t),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.into_iter().enumerate() {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    (kind, _) => {
                        return Err(ApiError::invalid(format!(
                            "content part of type '{kind}' is not supported: only 'text' parts with a 'text' field are"
                        ))
                        .param(format!("messages[{index}].content[{j}]")));
                    }
                }
            }
            Ok(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses a chat body and returns the error's (param, message) or `None` if it parses.
    fn check(body: &str, param: Option<&str>, message_has: &str) {
        match parse::<ChatRequest>(body.as_bytes(), CHAT_FIELDS) {
            Ok(_) => assert!(message_has.is_empty(), "{body} parsed"),
            Err(e) => {
                assert_eq!(e.status, 400, "{body}");
                assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
                assert!(e.message.contains(message_has), "{body}: {}", e.message);
            }
        }
    }

    #[test]
    fn request_errors_name_the_parameter() {
        let ok = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]"#;
        check(&format!("{ok}}}"), None, "");
        check(&format!("{ok},\"temperature\":null}}"), None, "");
        check("{", None, "not valid JSON");
        check("[1]", None, "JSON object");
        check(
            &format!("{ok},\"max_token\":5}}"),
            Some("max_token"),
            "unrecognized",
        );
        check(
            &format!("{ok},\"temperature\":\"hot\"}}"),
            Some("temperature"),
            "invalid type",
        );
        check(
            &format!("{ok},\"max_tokens\":-1}}"),
            Some("max_tokens"),
            "invalid value",
        );
        check(&format!("{ok},\"n\":1.5}}"), Some("n"), "invalid type");
        check(r#"{"model":"m"}"#, None, "missing field `messages`");
        check(
            r#"{"model":"m","messages":[{"content":"x"}]}"#,
            Some("messages[0]"),
            "role",
        );
    }
}
