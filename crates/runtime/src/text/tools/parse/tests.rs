//! The parser on each format's calls and on recorded outputs, fed whole, split at every
//! character and one character at a time.

use serde_json::json;

use super::*;

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "get_weather".into(),
        parameters: json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}}),
    }]
}

fn call(name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// Content, calls (their arguments the sum of their pieces) and how many pieces each
/// call's arguments came in, from `text` fed in `chunks`.
fn run(format: ToolFormat, chunks: &[&str]) -> (String, Vec<ToolCall>, Vec<usize>) {
    let mut p = ToolParser::new(format, &tools());
    let mut events: Vec<ToolEvent> = chunks.iter().flat_map(|c| p.push(c)).collect();
    events.extend(p.finish());
    let (mut content, mut calls, mut pieces) = (String::new(), Vec::new(), Vec::new());
    for e in events {
        match e {
            ToolEvent::Text(t) => content.push_str(&t),
            ToolEvent::CallStart(name) => {
                calls.push(call(&name, ""));
                pieces.push(0);
            }
            ToolEvent::Arguments(a) => {
                let c: &mut ToolCall = calls.last_mut().expect("arguments before a call");
                c.arguments.push_str(&a);
                *pieces.last_mut().unwrap() += 1;
            }
        }
    }
    assert_eq!(p.calls(), calls.len());
    (content, calls, pieces)
}

/// Parses `text` whole, in two chunks split at every character, and one character at a
/// time; all must give `text_want` as content and `calls_want`, each call started
/// before its arguments. Returns how many pieces each call's arguments came in when fed
/// one character at a time.
fn pieces(format: ToolFormat, text: &str, text_want: &str, calls_want: &[ToolCall]) -> Vec<usize> {
    let want = (text_want.to_string(), calls_want.to_vec());
    let strip = |(t, c, _): (String, Vec<ToolCall>, Vec<usize>)| (t, c);
    assert_eq!(
        strip(run(format, &[text])),
        want,
        "{format:?} whole: {text}"
    );
    for (i, _) in text.char_indices().skip(1) {
        let got = strip(run(format, &[&text[..i], &text[i..]]));
        assert_eq!(got, want, "{format:?} split at {i}: {text}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chunks: Vec<&str> = chars.iter().map(String::as_str).collect();
    let (content, calls, pieces) = run(format, &chunks);
    assert_eq!((content, calls), want, "{format:?} by character: {text}");
    pieces
}

/// [`pieces`], with every call's arguments streamed: in more than one piece.
fn check(format: ToolFormat, text: &str, text_want: &str, calls_want: &[ToolCall]) {
    let n = pieces(format, text, text_want, calls_want);
    assert!(
        n.iter().all(|&n| n > 1),
        "{format:?} not streamed {n:?}: {text}"
    );
}

/// [`pieces`], with every call's arguments sent whole when the call is complete.
fn check_whole(format: ToolFormat, text: &str, text_want: &str, calls_want: &[ToolCall]) {
    let n = pieces(format, text, text_want, calls_want);
    assert!(
        n.iter().all(|&n| n == 1),
        "{format:?} streamed {n:?}: {text}"
    );
}

#[test]
fn written_calls_parse_back_in_every_format() {
    // As the templates write them (Python's separators); GLM-4.5's are rebuilt compact.
    let calls = [
        call("get_weather", r#"{"city": "Paris", "days": 3}"#),
        call("get_weather", r#"{"city": "Oslo"}"#),
    ];
    let compact = [
        call("get_weather", r#"{"city":"Paris","days":3}"#),
        call("get_weather", r#"{"city":"Oslo"}"#),
    ];
    for format in [
        ToolFormat::Hermes,
        ToolFormat::Generic,
        ToolFormat::DeepSeekV3,
        ToolFormat::Glm45,
        ToolFormat::Mistral,
        ToolFormat::Llama3,
    ] {
        let text = format.write_calls(&calls);
        let want = if format == ToolFormat::Glm45 {
            &compact
        } else {
            &calls
        };
        check(format, &text, "", want);
        check(
            format,
            &format!("Let me check.\n{text}"),
            "Let me check.",
            want,
        );
    }
}

#[test]
fn hermes_outputs() {
    let paris = call("get_weather", r#"{"city": "Paris"}"#);
    // Qwen2.5-Instruct's shape: text, then calls on their own lines.
    check(
        ToolFormat::Hermes,
        "I'll look that up.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n",
        "I'll look that up.",
        std::slice::from_ref(&paris),
    );
    // Arguments as a JSON string, and a call cut off by the end of generation: whole.
    check_whole(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}",
        "",
        &[call("get_weather", r#"{"city":"Paris"}"#)],
    );
    // Cut off inside the arguments: the call ends with what was written.
    check(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
        "",
        &[call("get_weather", r#"{"city": "Par"#)],
    );
    // Arguments that stop being JSON end at their last valid byte; a brace or tag
    // inside a string is the string's.
    check(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": Paris}}\n</tool_call>ok",
        "ok",
        &[call("get_weather", r#"{"city": "#)],
    );
    check(
        ToolFormat::Hermes,
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"}</tool_call>\"}}</tool_call>",
        "",
        &[call("get_weather", r#"{"city": "}</tool_call>"}"#)],
    );
    // Nested values, escapes and characters of several bytes, cut anywhere.
    let nested = r#"{"city": "Zürich \"Züri\" 東京", "days": [1, {"n": -2.5e1}], "x": null}"#;
    check(
        ToolFormat::Hermes,
        &format!(
            "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {nested}}}\n</tool_call>"
        ),
        "",
        &[call("get_weather", nested)],
    );
    // Not a call: the tags stay text.
    for text in [
        "Use <tool_call>like this</tool_call> to call.",
        "a < b <tool",
        "<tool_call>{\"name\": \"x</tool_call> and more",
    ] {
        check(ToolFormat::Hermes, text, text, &[]);
    }
    // Qwen2.5-Coder-0.5B's shape with `tool_choice: auto` (recorded from the GGUF):
    // the call without its tags, bare or fenced, one or several.
    let oslo = call("get_weather", r#"{"city": "Oslo"}"#);
    check(
        ToolFormat::Hermes,
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
        "",
        std::slice::from_ref(&paris),
    );
    check(
        ToolFormat::Hermes,
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```\n",
        "",
        std::slice::from_ref(&paris),
    );
    check(
        ToolFormat::Hermes,
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
        "",
        &[paris.clone(), oslo],
    );
    // Other shapes of the bare call: whole, compact.
    check_whole(
        ToolFormat::Hermes,
        "{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\"}",
        "",
        &[call("get_weather", r#"{"city":"Paris"}"#)],
    );
    // Not calls: JSON that names no tool, JSON after text, and text that is not JSON.
    let other = "{\"name\": \"Ada\", \"arguments\": {\"x\": 1}}";
    let late = "Call it as {\"name\": \"get_weather\", \"arguments\": {}}";
    for text in [
        other,
        late,
        "{braces} and ``` fences",
        "```python\nprint(1)\n```",
        "plain answer\n",
    ] {
        check(ToolFormat::Hermes, text, text, &[]);
    }
}

#[test]
fn deepseek_outputs() {
    let paris = call("get_weather", r#"{"city": "Paris"}"#);
    // V3's shape, with its closing token.
    check(
        ToolFormat::DeepSeekV3,
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "",
        std::slice::from_ref(&paris),
    );
    // V3.1's shape, after text.
    check(
        ToolFormat::DeepSeekV3,
        "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "Sure.",
        std::slice::from_ref(&paris),
    );
}

#[test]
fn glm_outputs() {
    check(
        ToolFormat::Glm45,
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        "",
        &[call("get_weather", r#"{"city":"123","days":2}"#)],
    );
}

#[test]
fn mistral_outputs() {
    let paris = call("get_weather", r#"{"city": "Paris"}"#);
    check(
        ToolFormat::Mistral,
        "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefghi\"}]",
        "",
        std::slice::from_ref(&paris),
    );
    check(
        ToolFormat::Mistral,
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
        "",
        std::slice::from_ref(&paris),
    );
    check(
        ToolFormat::Mistral,
        "Here: [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
        "Here:",
        std::slice::from_ref(&paris),
    );
    // An item in another shape is read whole; the array ends before one that is no call.
    check_whole(
        ToolFormat::Mistral,
        "[TOOL_CALLS] [{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\"}, 7]",
        ", 7]",
        &[call("get_weather", r#"{"city":"Paris"}"#)],
    );
    check(
        ToolFormat::Mistral,
        "[TOOL_CALLS] not json",
        "[TOOL_CALLS] not json",
        &[],
    );
}

#[test]
fn llama3_outputs() {
    check(
        ToolFormat::Llama3,
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "",
        &[call("get_weather", r#"{"city": "Paris"}"#)],
    );
    check(
        ToolFormat::Llama3,
        "The JSON {\"name\": \"x\"} has no parameters.",
        "The JSON {\"name\": \"x\"} has no parameters.",
        &[],
    );
}
