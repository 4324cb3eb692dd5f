//! The grammar of "a valid call" in each format, as llguidance's Lark dialect: the
//! format's fixed text as literals, each tool's name as a literal, its arguments as a
//! `%json` schema, so the arguments a constrained model writes validate against the tool's
//! `parameters`.
//!
//! Markers that are special tokens of the model's vocabulary (`[TOOL_CALLS]` in Mistral's)
//! are written as the token (`<[id]>`) rather than as text, which the model could only spell
//! out of byte pieces it never saw in training.

use serde_json::{Value, json};

use super::{DS_CALL_BEGIN, DS_CALL_END, DS_CALLS_BEGIN, DS_CALLS_END, DS_SEP};
use super::{ToolFormat, ToolSpec, arguments_schema, properties};

/// A Lark grammar whose sentences are one call, or with `parallel` one or more, of one of
/// `tools` in `format`. `special(text)` gives the id of a special token spelled `text`, if
/// the vocabulary has one.
pub fn tool_grammar(
    format: ToolFormat,
    tools: &[ToolSpec],
    parallel: bool,
    special: &dyn Fn(&str) -> Option<u32>,
) -> String {
    let lit = |s: &str| match special(s) {
        Some(id) => format!("<[{id}]>"),
        None => Value::String(s.to_string()).to_string(),
    };
    let (open, sep, close) = match format {
        ToolFormat::Hermes | ToolFormat::Generic | ToolFormat::Glm45 => {
            (String::new(), lit("\n"), String::new())
        }
        ToolFormat::DeepSeekV3 => (lit(DS_CALLS_BEGIN), lit("\n"), lit(DS_CALLS_END)),
        ToolFormat::Mistral => (
            format!("{} {}", lit("[TOOL_CALLS]"), lit(" [")),
            lit(", "),
            lit("]"),
        ),
        ToolFormat::Llama3 => (String::new(), lit("; "), String::new()),
    };
    let more = if parallel && format.parallel() {
        format!(" ({sep} call)*")
    } else {
        String::new()
    };
    let mut g = format!("start: {open} call{more} {close}\n");
    let names: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    g.push_str(&format!("call: {}\n", names.join(" | ")));
    for (i, tool) in tools.iter().enumerate() {
        let args = json_schema(&arguments_schema(tool));
        let body = match format {
            ToolFormat::Hermes | ToolFormat::Generic => format!(
                "{} {} {args} {} {}",
                lit("<tool_call>"),
                lit(&format!("\n{{\"name\": \"{}\", \"arguments\": ", tool.name)),
                lit("}\n"),
                lit("</tool_call>")
            ),
            ToolFormat::DeepSeekV3 => format!(
                "{} {} {} {} {args} {} {}",
                lit(DS_CALL_BEGIN),
                lit("function"),
                lit(DS_SEP),
                lit(&format!("{}\n```json\n", tool.name)),
                lit("\n```"),
                lit(DS_CALL_END)
            ),
            ToolFormat::Glm45 => format!(
                "{} {} {} {}",
                lit("<tool_call>"),
                lit(&tool.name),
                glm_arguments(&arguments_schema(tool), &lit),
                lit("</tool_call>")
            ),
            ToolFormat::Mistral => format!(
                "{} {args} {}",
                lit(&format!("{{\"name\": \"{}\", \"arguments\": ", tool.name)),
                lit("}")
            ),
            ToolFormat::Llama3 => format!(
                "{} {args} {}",
                lit(&format!("{{\"name\": \"{}\", \"parameters\": ", tool.name)),
                lit("}")
            ),
        };
        g.push_str(&format!("call_{i}: {body}\n"));
    }
    if format == ToolFormat::Glm45 {
        g.push_str("GLM_TEXT: /[^<]+/\n");
    }
    g
}

/// `%json {schema}`, generated with the separators templates render (`", "`, `": "`) unless
/// the schema sets its own `x-guidance`.
fn json_schema(schema: &Value) -> String {
    let mut schema = schema.clone();
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    format!("%json {schema}")
}

/// GLM-4.5's `<arg_key>`/`<arg_value>` pairs, one per property in the schema's order (the
/// optional ones optional); string values are raw text without `<` (`maxLength` kept),
/// enums of strings one of their values, other values JSON.
fn glm_arguments(schema: &Value, lit: &dyn Fn(&str) -> String) -> String {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = String::new();
    for (key, prop) in properties(schema).into_iter().flatten() {
        let strings: Option<Vec<&str>> = prop
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.iter().map(Value::as_str).collect());
        let value = match (strings, prop.get("type").and_then(Value::as_str)) {
            (Some(e), _) if !e.is_empty() => {
                let alts: Vec<String> = e.iter().map(|s| lit(s)).collect();
                format!("({})", alts.join(" | "))
            }
            (_, Some("string")) => match prop.get("maxLength").and_then(Value::as_u64) {
                Some(0) => String::new(),
                Some(n) => format!("/[^<]{{1,{n}}}/?"),
                None => "GLM_TEXT?".to_string(),
            },
            _ => json_schema(prop),
        };
        let pair = format!(
            "{} {value} {}",
            lit(&format!("\n<arg_key>{key}</arg_key>\n<arg_value>")),
            lit("</arg_value>")
        );
        if required.contains(&key.as_str()) {
            out.push_str(&format!(" {pair}"));
        } else {
            out.push_str(&format!(" ({pair})?"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::grammar::{GrammarCompiler, ResponseFormat};
    use crate::text::Tokenizer;
    use crate::text::tools::ToolCall;

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {
                    "city": {"type": "string"},
                    "unit": {"enum": ["c", "f"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                    "required": ["city", "days"]}),
            },
            ToolSpec {
                name: "ping".into(),
                parameters: Value::Null,
            },
        ]
    }

    fn call(name: &str, args: Value) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.to_string(),
        }
    }

    #[test]
    fn grammars_accept_the_formats_own_calls_and_nothing_else() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
        let tokenizer = Tokenizer::from_dir(dir).unwrap();
        let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).unwrap();
        let good = [
            call(
                "get_weather",
                json!({"city": "Paris", "unit": "c", "days": 3}),
            ),
            call("ping", json!({})),
        ];
        let bad_type = [call("get_weather", json!({"city": "Paris", "days": "3"}))];
        let bad_range = [call("get_weather", json!({"city": "Paris", "days": 9}))];
        let bad_name = [call("get_weather_now", json!({"city": "Paris", "days": 3}))];
        for format in [
            ToolFormat::Hermes,
            ToolFormat::Generic,
            ToolFormat::DeepSeekV3,
            ToolFormat::Glm45,
            ToolFormat::Mistral,
            ToolFormat::Llama3,
        ] {
            let lark = tool_grammar(format, &tools(), true, &|_| None);
            let grammar = compiler
                .compile(&ResponseFormat::Lark(lark.clone()))
                .unwrap_or_else(|e| panic!("{format:?}: {e}\n{lark}"));
            let accepts = |calls: &[ToolCall]| {
                let text = format.write_calls(calls);
                let ids = tokenizer.encode(&text, false).unwrap();
                grammar.clone().accepts(&ids)
            };
            let n = if format.parallel() { 2 } else { 1 };
            assert!(
                accepts(&good[..n]),
                "{format:?}: {}",
                format.write_calls(&good[..n])
            );
            assert!(accepts(&good[1..]), "{format:?}");
            // GLM-4.5 writes every value as text: a quoted number is a number there.
            if format != ToolFormat::Glm45 {
                assert!(!accepts(&bad_type), "{format:?}");
            }
            assert!(!accepts(&bad_range), "{format:?}");
            assert!(!accepts(&bad_name), "{format:?}");
            assert!(!accepts(&[]), "{format:?}");
        }
    }

    #[test]
    fn special_token_markers_are_written_as_tokens() {
        let lark = tool_grammar(ToolFormat::Mistral, &tools(), false, &|s| {
            (s == "[TOOL_CALLS]").then_some(5)
        });
        assert!(lark.starts_with("start: <[5]> \" [\" call "), "{lark}");
    }
}
