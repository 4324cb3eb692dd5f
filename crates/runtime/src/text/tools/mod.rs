//! Tool calling in each model's own format: how a chat template wants tool definitions,
//! calls and results in the conversation, what a model writes when it calls a tool, and a
//! grammar that makes it write a valid call.
//!
//! - [`ToolFormat`] is a template family, recognised from the template's source
//!   ([`ToolFormat::detect`]): Hermes `<tool_call>` JSON (Qwen2.5, Qwen3), DeepSeek-V3's
//!   tool tokens, GLM-4.5's `<arg_key>`/`<arg_value>` pairs, Mistral's `[TOOL_CALLS]`
//!   array, Llama 3.x's bare JSON, and a generic fallback for templates that know nothing
//!   of tools (the tools are described in a system message and calls use Hermes' syntax).
//! - [`prepare_messages`] adapts an OpenAI conversation to what the family's templates read.
//! - [`ToolParser`] turns generated text, chunk by chunk, into text and [`ToolCall`]s.
//! - [`tool_grammar`] writes the Lark grammar (arguments as `%json` schemas) that
//!   llguidance enforces for `tool_choice` `required` or a named function.
//!
//! A key design decision made here is that each family's syntax is written once, in
//! [`ToolFormat::write_calls`], and the parser and the grammar are tested against it: a
//! call the grammar forces is a call the parser reads back, and the history the template
//! renders spells calls the way the model is asked to spell them.

mod lark;
mod parse;

use std::fmt::Write as _;

use serde_json::{Map, Value, json};

pub use lark::tool_grammar;
pub use parse::{ToolEvent, ToolParser};

/// A tool the model may call: its name and its arguments' JSON schema.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The function's name.
    pub name: String,
    /// JSON schema of the arguments (an object schema).
    pub parameters: Value,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The function called.
    pub name: String,
    /// Its arguments: a JSON object, as text.
    pub arguments: String,
}

/// How a family of chat templates writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Qwen2.5, Qwen3,
    /// Hermes).
    Hermes,
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>...`
    /// (DeepSeek-V3; V3.1's `NAME<｜tool▁sep｜>{...}` is read too).
    DeepSeekV3,
    /// `<tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call>`
    /// (GLM-4.5): string values raw, others as JSON.
    Glm45,
    /// `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (Mistral, Mixtral).
    Mistral,
    /// `{"name": ..., "parameters": {...}}` (Llama 3.1-3.3 JSON tool calling).
    Llama3,
    /// A template without tool support: tools and calls are written into the messages'
    /// text in Hermes' syntax.
    Generic,
}

const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The family of a chat template, from markers in its source (as llama.cpp's
    /// `common_chat_templates` does).
    pub fn detect(source: &str) -> ToolFormat {
        if source.contains(DS_CALL_BEGIN) {
            ToolFormat::DeepSeekV3
        } else if source.contains("<arg_key>") {
            ToolFormat::Glm45
        } else if source.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if source.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if source.contains("<|start_header_id|>") && source.contains("ipython") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// Every marker of the format's calls that the parser reads in the output text.
    /// Where one is a special token of the vocabulary (Mistral's `[TOOL_CALLS]`, Llama
    /// 3.1's `<|python_tag|>`), generation must keep it in the text
    /// (`StreamDecoder::keep_special`): decoding leaves special tokens out.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes | ToolFormat::Generic => &[TOOL_OPEN, TOOL_CLOSE],
            ToolFormat::DeepSeekV3 => &[
                DS_CALLS_BEGIN,
                DS_CALLS_END,
                DS_CALL_BEGIN,
                DS_CALL_END,
                DS_SEP,
            ],
            ToolFormat::Glm45 => &[
                TOOL_OPEN,
                TOOL_CLOSE,
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
            ],
            ToolFormat::Mistral => &["[TOOL_CALLS]", "[ARGS]"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
        }
    }

    /// The text every sentence of the format's call grammar ([`tool_grammar`]) begins
    /// with: where the lazy grammar of `tool_choice: "auto"` starts constraining.
    pub fn call_trigger(self) -> &'static str {
        match self {
            ToolFormat::Hermes | ToolFormat::Generic | ToolFormat::Glm45 => TOOL_OPEN,
            ToolFormat::DeepSeekV3 => DS_CALLS_BEGIN,
            ToolFormat::Mistral => "[TOOL_CALLS]",
            ToolFormat::Llama3 => "{\"name\"",
        }
    }

    /// Lower-case name, for logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::DeepSeekV3 => "deepseek-v3",
            ToolFormat::Glm45 => "glm-4.5",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Llama3 => "llama3-json",
            ToolFormat::Generic => "generic",
        }
    }

    /// Whether the format can hold more than one call in a turn (Llama 3.1's templates
    /// refuse several).
    pub fn parallel(self) -> bool {
        self != ToolFormat::Llama3
    }

    /// `calls` as the model writes them in this format, arguments with Python's `json.dumps`
    /// separators (as templates render them with `tojson`).
    pub fn write_calls(self, calls: &[ToolCall]) -> String {
        let mut out = String::new();
        let args = |c: &ToolCall| {
            serde_json::from_str::<Value>(&c.arguments)
                .map_or_else(|_| c.arguments.clone(), |v| python_json(&v))
        };
        match self {
            ToolFormat::Hermes | ToolFormat::Generic => {
                for (i, c) in calls.iter().enumerate() {
                    if i > 0 {
                        out.push('\n');
                    }
                    let _ = write!(
                        out,
                        "<tool_call>\n{{\"name\": \"{}\", \"arguments\": {}}}\n</tool_call>",
                        c.name,
                        args(c)
                    );
                }
            }
            ToolFormat::DeepSeekV3 => {
                out.push_str(DS_CALLS_BEGIN);
                for (i, c) in calls.iter().enumerate() {
                    if i > 0 {
                        out.push('\n');
                    }
                    let _ = write!(
                        out,
                        "{DS_CALL_BEGIN}function{DS_SEP}{}\n```json\n{}\n```{DS_CALL_END}",
                        c.name,
                        args(c)
                    );
                }
                out.push_str(DS_CALLS_END);
            }
            ToolFormat::Glm45 => {
                for (i, c) in calls.iter().enumerate() {
                    if i > 0 {
                        out.push('\n');
                    }
                    let _ = write!(out, "<tool_call>{}", c.name);
                    if let Ok(Value::Object(m)) = serde_json::from_str(&c.arguments) {
                        for (k, v) in m {
                            let v = match v {
                                Value::String(s) => s,
                                v => python_json(&v),
                            };
                            let _ =
                                write!(out, "\n<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>");
                        }
                    }
                    out.push_str("</tool_call>");
                }
            }
            ToolFormat::Mistral => {
                out.push_str("[TOOL_CALLS] [");
                for (i, c) in calls.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    let _ = write!(
                        out,
                        "{{\"name\": \"{}\", \"arguments\": {}}}",
                        c.name,
                        args(c)
                    );
                }
                out.push(']');
            }
            ToolFormat::Llama3 => {
                for (i, c) in calls.iter().enumerate() {
                    if i > 0 {
                        out.push_str("; ");
                    }
                    let _ = write!(
                        out,
                        "{{\"name\": \"{}\", \"parameters\": {}}}",
                        c.name,
                        args(c)
                    );
                }
            }
        }
        out
    }
}

/// JSON with Python's `json.dumps` separators (`", "`, `": "`), keys in their order.
pub(crate) fn python_json(v: &Value) -> String {
    let mut out = String::new();
    write_python_json(&mut out, v);
    out
}

fn write_python_json(out: &mut String, v: &Value) {
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(out, item);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, item)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_python_json(out, item);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Adapts an OpenAI conversation (JSON messages, as the client sent them) to what the
/// family's templates read, in place:
///
/// - `tool_calls[].function.arguments` become objects (templates write them with `tojson`
///   or iterate them), except for DeepSeek-V3, whose template concatenates the string;
/// - an assistant message with calls and no text gets `content: null` for DeepSeek-V3
///   (its template tests `content is none`) and `""` for the others (Qwen3's calls string
///   methods on it);
/// - Mistral's templates want call ids of 9 letters and digits: each id is replaced by a
///   stable 9-character digest, in calls and results alike;
/// - when the template itself never mentions `tools` (`knows_tools` false), the tools and
///   the call syntax are described in a system message; for [`ToolFormat::Generic`] calls
///   and results also become text (calls in Hermes' syntax, results as user messages in
///   `<tool_response>` tags), since such templates know no `tool` role.
pub fn prepare_messages(
    format: ToolFormat,
    knows_tools: bool,
    messages: &mut Vec<Value>,
    tools: &[Value],
) {
    for m in messages.iter_mut() {
        let Some(obj) = m.as_object_mut() else {
            continue;
        };
        if format == ToolFormat::Mistral {
            let rename = |id: &mut Value| {
                if let Some(s) = id.as_str() {
                    *id = Value::String(mistral_id(s));
                }
            };
            if let Some(id) = obj.get_mut("tool_call_id") {
                rename(id);
            }
            for c in obj
                .get_mut("tool_calls")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(id) = c.get_mut("id") {
                    rename(id);
                }
            }
        }
        let calls = obj.get("tool_calls").and_then(Value::as_array).cloned();
        let Some(calls) = calls.filter(|c| !c.is_empty()) else {
            if format == ToolFormat::Generic && obj.get("role") == Some(&json!("tool")) {
                let text = obj.get("content").and_then(Value::as_str).unwrap_or("");
                let wrapped = format!("<tool_response>\n{text}\n</tool_response>");
                obj.insert("role".into(), json!("user"));
                obj.insert("content".into(), Value::String(wrapped));
                obj.remove("tool_call_id");
            }
            continue;
        };
        let empty = obj
            .get("content")
            .is_none_or(|c| c.is_null() || c.as_str() == Some(""));
        if format == ToolFormat::Generic {
            let parsed: Vec<ToolCall> = calls.iter().filter_map(call_of).collect();
            let mut text = obj
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&ToolFormat::Generic.write_calls(&parsed));
            obj.insert("content".into(), Value::String(text));
            obj.remove("tool_calls");
            continue;
        }
        if empty {
            let content = if format == ToolFormat::DeepSeekV3 {
                Value::Null
            } else {
                json!("")
            };
            obj.insert("content".into(), content);
        }
        if format != ToolFormat::DeepSeekV3
            && let Some(list) = obj.get_mut("tool_calls").and_then(Value::as_array_mut)
        {
            for f in list.iter_mut().filter_map(|c| c.get_mut("function")) {
                if let Some(args) = f.get_mut("arguments")
                    && let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str(s).ok())
                {
                    *args = parsed;
                }
            }
        }
    }
    if !knows_tools && !tools.is_empty() {
        let prompt = tools_prompt(format, tools);
        match messages.first_mut().and_then(Value::as_object_mut) {
            Some(first) if first.get("role") == Some(&json!("system")) => {
                let old = first.get("content").and_then(Value::as_str).unwrap_or("");
                let text = format!("{old}\n\n{prompt}");
                first.insert("content".into(), Value::String(text.trim_start().into()));
            }
            _ => messages.insert(0, json!({"role": "system", "content": prompt})),
        }
    }
}

/// The call in an OpenAI `tool_calls` entry.
fn call_of(c: &Value) -> Option<ToolCall> {
    let f = c.get("function")?;
    let arguments = match f.get("arguments")? {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some(ToolCall {
        name: f.get("name")?.as_str()?.to_string(),
        arguments,
    })
}

/// A system prompt that lists `tools` and shows the format's call syntax.
fn tools_prompt(format: ToolFormat, tools: &[Value]) -> String {
    let mut out = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        out.push('\n');
        out.push_str(&python_json(t));
    }
    let example = ToolCall {
        name: "<function-name>".into(),
        arguments: "<args-json-object>".into(),
    };
    let _ = write!(
        out,
        "\n</tools>\n\nFor each function call, return the function name and arguments in this format:\n{}",
        format.write_calls(&[example])
    );
    out
}

/// A stable 9-character id of letters and digits for `id` (what Mistral's templates ask
/// for): FNV-1a, in base 62.
fn mistral_id(id: &str) -> String {
    if id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return id.to_string();
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    (0..9)
        .map(|_| {
            let d = DIGITS[(h % 62) as usize] as char;
            h /= 62;
            d
        })
        .collect()
}

/// Schema of a tool's arguments: its `parameters`, or any object when it has none.
pub fn arguments_schema(tool: &ToolSpec) -> Value {
    match &tool.parameters {
        Value::Null => json!({"type": "object"}),
        p => p.clone(),
    }
}

/// Properties of an object schema, in order.
pub(crate) fn properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_recognised_by_their_markers() {
        let cases = [
            ("{{ '<tool_call>' }}", ToolFormat::Hermes),
            ("{{ '<｜tool▁call▁begin｜>' }}", ToolFormat::DeepSeekV3),
            ("<tool_call>{{ n }}<arg_key>", ToolFormat::Glm45),
            ("[TOOL_CALLS] [", ToolFormat::Mistral),
            (
                "<|start_header_id|>ipython<|end_header_id|>",
                ToolFormat::Llama3,
            ),
            ("<|{{ m.role }}|>", ToolFormat::Generic),
        ];
        for (src, want) in cases {
            assert_eq!(ToolFormat::detect(src), want, "{src}");
        }
    }

    #[test]
    fn history_is_adapted_per_family() {
        let history = || {
            vec![
                json!({"role": "user", "content": "weather?"}),
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_abc", "type": "function",
                     "function": {"name": "get", "arguments": "{\"city\": \"Paris\"}"}}]}),
                json!({"role": "tool", "tool_call_id": "call_abc", "content": "sunny"}),
            ]
        };
        let tools = [json!({"type": "function", "function": {"name": "get"}})];

        let mut m = history();
        prepare_messages(ToolFormat::Hermes, true, &mut m, &tools);
        assert_eq!(m[1]["content"], json!(""));
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(m.len(), 3);

        let mut m = history();
        prepare_messages(ToolFormat::DeepSeekV3, false, &mut m, &tools);
        assert_eq!(m[0]["role"], "system");
        assert!(m[0]["content"].as_str().unwrap().contains(DS_CALL_BEGIN));
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            json!("{\"city\": \"Paris\"}")
        );

        let mut m = history();
        prepare_messages(ToolFormat::Mistral, true, &mut m, &tools);
        let id = m[1]["tool_calls"][0]["id"].as_str().unwrap();
        assert_eq!(id.len(), 9);
        assert_eq!(m[2]["tool_call_id"], json!(id));

        let mut m = history();
        prepare_messages(ToolFormat::Generic, false, &mut m, &tools);
        assert_eq!(m[0]["role"], "system");
        assert_eq!(
            m[2]["content"],
            "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
        assert!(m[2].get("tool_calls").is_none());
        assert_eq!(m[3]["role"], "user");
        assert_eq!(m[3]["content"], "<tool_response>\nsunny\n</tool_response>");
    }
}
