//! Tool calling on `/v1/chat/completions`: `tools`, `tool_choice` and
//! `parallel_tool_calls` checked field by field, the conversation rendered through the
//! model's template with its tools, and the grammar that enforces `required` and named
//! choices.
//!
//! A key design decision made here is that the template decides the tool-call format
//! ([`ToolFormat::detect`] on its source), whichever template renders the request (the
//! model's own or a client's `chat_template`, as vLLM accepts): the prompt, the grammar and
//! the parser then always agree on one syntax.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use strata_runtime::grammar::{Grammar, GrammarError, ResponseFormat};
use strata_runtime::text::tools::{
    ToolFormat, ToolSpec, arguments_schema, prepare_messages, tool_grammar,
};

use crate::AppState;
use crate::error::ApiError;

/// Most tools per request (OpenAI's limit).
const MAX_TOOLS: usize = 128;
/// Longest function name (OpenAI's limit).
const MAX_NAME: usize = 64;
/// Longest `chat_template` override, in bytes.
const MAX_TEMPLATE: usize = 64 << 10;

/// `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Never call: the tools are not shown to the model and its text is not parsed.
    None,
    /// The model decides; its output is parsed for calls.
    Auto,
    /// At least one call, enforced by the grammar.
    Required,
    /// A call of this tool (index into the tools), enforced by the grammar.
    Named(usize),
}

/// The tool fields of a chat request, checked.
#[derive(Debug)]
pub(crate) struct ToolRequest {
    /// The tools as the template sees them (`{"type": "function", "function": {...}}`).
    pub defs: Vec<Value>,
    /// Names and argument schemas.
    pub specs: Vec<ToolSpec>,
    pub choice: Choice,
    pub parallel: bool,
}

/// What generation needs to read calls back: the format and the tools.
#[derive(Debug, Clone)]
pub(crate) struct CallParsing {
    pub format: ToolFormat,
    pub specs: Vec<ToolSpec>,
}

fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::invalid(message).param(param)
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls`; errors name the field.
pub(crate) fn tool_request(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<ToolRequest, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(other) => {
            return Err(invalid(
                "tools",
                format!("tools must be an array, got {other}"),
            ));
        }
    };
    if list.len() > MAX_TOOLS {
        return Err(invalid(
            "tools",
            format!(
                "at most {MAX_TOOLS} tools are supported, got {}",
                list.len()
            ),
        ));
    }
    let mut defs = Vec::with_capacity(list.len());
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let (def, spec) = tool(i, t)?;
        if specs.iter().any(|s| s.name == spec.name) {
            return Err(invalid(
                format!("tools[{i}].function.name"),
                format!("tools[{i}].function.name '{}' is not unique", spec.name),
            ));
        }
        defs.push(def);
        specs.push(spec);
    }
    let choice = tool_choice(choice, &specs)?;
    Ok(ToolRequest {
        defs,
        specs,
        choice,
        parallel: parallel.unwrap_or(true),
    })
}

/// One entry of `tools`: the definition the template sees and the spec.
fn tool(i: usize, t: &Value) -> Result<(Value, ToolSpec), ApiError> {
    let at = format!("tools[{i}]");
    let Some(obj) = t.as_object() else {
        return Err(invalid(&at, format!("{at} must be an object, got {t}")));
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !["type", "function"].contains(&k.as_str()))
    {
        return Err(invalid(
            format!("{at}.{k}"),
            format!("unrecognized field {at}.{k}"),
        ));
    }
    if obj.get("type") != Some(&json!("function")) {
        return Err(invalid(
            format!("{at}.type"),
            format!(
                "{at}.type must be 'function', got {}",
                obj.get("type").unwrap_or(&Value::Null)
            ),
        ));
    }
    let f_at = format!("{at}.function");
    let Some(f) = obj.get("function").and_then(Value::as_object) else {
        return Err(invalid(
            &f_at,
            format!("{f_at} must be an object with a 'name'"),
        ));
    };
    let known = ["name", "description", "parameters", "strict"];
    if let Some(k) = f.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(invalid(
            format!("{f_at}.{k}"),
            format!("unrecognized field {f_at}.{k}"),
        ));
    }
    let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
    let name_ok = (1..=MAX_NAME).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !name_ok {
        return Err(invalid(
            format!("{f_at}.name"),
            format!(
                "{f_at}.name must be 1 to {MAX_NAME} letters, digits, underscores or dashes, got {}",
                f.get("name").map_or("nothing".into(), Value::to_string)
            ),
        ));
    }
    if let Some(d) = f
        .get("description")
        .filter(|d| !d.is_string() && !d.is_null())
    {
        return Err(invalid(
            format!("{f_at}.description"),
            format!("{f_at}.description must be a string, got {d}"),
        ));
    }
    if let Some(s) = f.get("strict").filter(|s| !s.is_boolean() && !s.is_null()) {
        return Err(invalid(
            format!("{f_at}.strict"),
            format!("{f_at}.strict must be a boolean, got {s}"),
        ));
    }
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => Value::Null,
        Some(p @ Value::Object(_)) => p.clone(),
        Some(other) => {
            return Err(invalid(
                format!("{f_at}.parameters"),
                format!("{f_at}.parameters must be a JSON Schema object, got {other}"),
            ));
        }
    };
    let mut def = Map::new();
    def.insert("name".into(), json!(name));
    if let Some(d) = f.get("description").filter(|d| d.is_string()) {
        def.insert("description".into(), d.clone());
    }
    if !parameters.is_null() {
        def.insert("parameters".into(), parameters.clone());
    }
    let def = json!({"type": "function", "function": def});
    let spec = ToolSpec {
        name: name.to_string(),
        parameters,
    };
    Ok((def, spec))
}

fn tool_choice(v: Option<&Value>, specs: &[ToolSpec]) -> Result<Choice, ApiError> {
    let choice = match v {
        None | Some(Value::Null) if specs.is_empty() => Choice::None,
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(invalid(
                    "tool_choice",
                    format!(
                        "unknown tool_choice '{other}': expected 'none', 'auto', 'required' or an object naming a function"
                    ),
                ));
            }
        },
        Some(Value::Object(o)) => {
            if o.get("type") != Some(&json!("function")) {
                return Err(invalid(
                    "tool_choice.type",
                    "tool_choice.type must be 'function'",
                ));
            }
            let Some(name) = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            else {
                return Err(invalid(
                    "tool_choice.function.name",
                    "tool_choice.function.name is missing",
                ));
            };
            match specs.iter().position(|s| s.name == name) {
                Some(i) => Choice::Named(i),
                None => {
                    return Err(invalid(
                        "tool_choice.function.name",
                        format!("tool_choice names '{name}', which is not in tools"),
                    ));
                }
            }
        }
        Some(other) => {
            return Err(invalid(
                "tool_choice",
                format!("tool_choice must be a string or an object, got {other}"),
            ));
        }
    };
    if specs.is_empty() && matches!(choice, Choice::Required | Choice::Auto) {
        return Err(invalid(
            "tool_choice",
            "tool_choice 'auto' or 'required' needs a non-empty tools list",
        ));
    }
    Ok(choice)
}

/// The request's chat template source: its own `chat_template` or the model's.
pub(crate) fn template_source(
    st: &AppState,
    own: Option<String>,
) -> Result<Option<String>, ApiError> {
    match own {
        Some(t) if t.len() > MAX_TEMPLATE => Err(invalid(
            "chat_template",
            format!(
                "chat_template is {} bytes; at most {MAX_TEMPLATE} are accepted",
                t.len()
            ),
        )),
        Some(t) => Ok(Some(t)),
        None => Ok(st.engine.tokenizer.meta().chat_template.clone()),
    }
}

/// Renders `messages` (OpenAI JSON) with the template `source` and the request's tools,
/// and tokenizes the prompt. Returns the prompt and the template's tool format; the error
/// is the template's message.
pub(crate) fn render(
    st: &AppState,
    source: Option<&str>,
    own_template: bool,
    mut messages: Vec<Value>,
    tools: &ToolRequest,
) -> Result<(Vec<u32>, ToolFormat), String> {
    let tokenizer = &st.engine.tokenizer;
    let template = match source {
        Some(s) if own_template => tokenizer.chat_template_from(s, "the request's chat_template"),
        _ => tokenizer.chat_template(),
    }
    .map_err(|e| e.to_string())?;
    let source = source.unwrap_or("");
    let format = ToolFormat::detect(source);
    let shown: &[Value] = if tools.choice == Choice::None {
        &[]
    } else {
        &tools.defs
    };
    let knows_tools = source.contains("tools");
    prepare_messages(format, knows_tools, &mut messages, shown);
    let mut extra = Map::new();
    if knows_tools && !shown.is_empty() {
        extra.insert("tools".into(), Value::Array(shown.to_vec()));
    }
    let text = template
        .render_json(&Value::Array(messages), true, &extra)
        .map_err(|e| e.to_string())?;
    // Templates write the BOS token themselves where the model wants it.
    let ids = tokenizer.encode(&text, false).map_err(|e| e.to_string())?;
    Ok((ids, format))
}

/// The grammar of the tool calls the choice allows: from the first token for `required`
/// and a named function; for `auto`, a lazy one that starts at the format's opening marker,
/// so the model may answer in text, and a call it begins is valid (`None` for `none`).
///
/// Under `auto`, a tool whose parameters the grammar engine cannot enforce is not a 400,
/// as it is when a call is forced: the request runs without the lazy grammar, with a
/// warning in the log.
pub(crate) async fn grammar(
    st: &Arc<AppState>,
    tools: &ToolRequest,
    format: ToolFormat,
) -> Result<Option<Grammar>, ApiError> {
    let chosen: Vec<ToolSpec> = match tools.choice {
        Choice::None => return Ok(None),
        Choice::Auto | Choice::Required => tools.specs.clone(),
        Choice::Named(i) => vec![tools.specs[i].clone()],
    };
    let engine = Arc::clone(&st.engine);
    let parallel = tools.parallel;
    let result = tokio::task::spawn_blocking(move || {
        let special = |s: &str| engine.tokenizer.special_token_id(s);
        let lark = tool_grammar(format, &chosen, parallel, &special);
        match engine.compile_format(&ResponseFormat::Lark(lark)) {
            Ok(g) => Ok(g),
            // Name the tool whose schema cannot be enforced.
            Err(GrammarError::Schema(m)) => Err(chosen
                .iter()
                .position(|t| {
                    let schema = ResponseFormat::JsonSchema(arguments_schema(t));
                    engine.compile_format(&schema).is_err()
                })
                .map_or((None, m.clone()), |i| (Some(i), m))),
            Err(e) => Err((None, e.to_string())),
        }
    })
    .await
    .map_err(|e| {
        tracing::error!("tool grammar task failed: {e}");
        ApiError::internal()
    })?;
    if tools.choice == Choice::Auto {
        return Ok(match result {
            Ok(g) => Some(g.lazy(vec![format.call_trigger().to_string()])),
            Err((_, m)) => {
                tracing::warn!("tool_choice auto runs without a call grammar: {m}");
                None
            }
        });
    }
    result.map(Some).map_err(|(i, m)| {
        let param = match (i, tools.choice) {
            (Some(i), Choice::Named(n)) => format!("tools[{}].function.parameters", n + i),
            (Some(i), _) => format!("tools[{i}].function.parameters"),
            (None, _) => "tools".to_string(),
        };
        invalid(param.clone(), format!("{param} cannot be enforced: {m}"))
    })
}

/// A new call id: `call_` and 24 hexadecimal digits, unique within the server's life.
pub(crate) fn call_id(created: u64) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("call_{:08x}{n:016x}", created as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks the error's parameter (or, with `None`, that the fields parse).
    fn check(tools: Value, choice: Value, param: Option<&str>) {
        let choice = (!choice.is_null()).then_some(&choice);
        match (tool_request(Some(&tools), choice, None), param) {
            (Ok(_), None) => {}
            (Ok(r), Some(p)) => panic!("{tools} parsed as {r:?}, expected an error on {p}"),
            (Err(e), want) => {
                assert_eq!(e.status, 400, "{tools}");
                assert_eq!(e.param.as_deref(), want, "{tools}: {}", e.message);
            }
        }
    }

    #[test]
    fn malformed_tools_name_the_field() {
        let f = |name: Value| json!([{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]);
        check(f(json!("get_weather")), Value::Null, None);
        check(f(json!("get_weather")), json!("required"), None);
        check(
            f(json!("get_weather")),
            json!({"type": "function", "function": {"name": "get_weather"}}),
            None,
        );
        check(json!({}), Value::Null, Some("tools"));
        check(json!([1]), Value::Null, Some("tools[0]"));
        check(
            json!([{"type": "code", "function": {"name": "a"}}]),
            Value::Null,
            Some("tools[0].type"),
        );
        check(
            json!([{"type": "function"}]),
            Value::Null,
            Some("tools[0].function"),
        );
        check(f(json!("a b")), Value::Null, Some("tools[0].function.name"));
        check(f(json!(7)), Value::Null, Some("tools[0].function.name"));
        check(
            json!([{"type": "function", "function": {"name": "a", "parameters": [1]}}]),
            Value::Null,
            Some("tools[0].function.parameters"),
        );
        check(
            json!([{"type": "function", "function": {"name": "a", "params": {}}}]),
            Value::Null,
            Some("tools[0].function.params"),
        );
        check(
            json!([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]),
            Value::Null,
            Some("tools[1].function.name"),
        );
        check(f(json!("a")), json!("sometimes"), Some("tool_choice"));
        check(f(json!("a")), json!(3), Some("tool_choice"));
        check(
            f(json!("a")),
            json!({"type": "function", "function": {"name": "b"}}),
            Some("tool_choice.function.name"),
        );
        check(
            f(json!("a")),
            json!({"type": "function"}),
            Some("tool_choice.function.name"),
        );
        check(json!([]), json!("required"), Some("tool_choice"));
        check(json!([]), json!("none"), None);
    }
}
