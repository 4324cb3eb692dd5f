//! Generated text back into tool calls, chunk by chunk.
//!
//! [`ToolParser`] scans for the format's opening markers; text that cannot be part of a
//! marker is released at once, a possible marker prefix is held back, and from a marker
//! on the text is buffered until the call it opens is complete (then a [`ToolEvent::Call`])
//! or turns out not to be a call (then it is released as text). Whitespace around calls is
//! dropped, as vLLM and llama.cpp do.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::{
    DS_CALL_BEGIN, DS_CALL_END, DS_CALLS_BEGIN, DS_CALLS_END, DS_SEP, ToolCall, ToolFormat,
    ToolSpec, properties,
};

/// What a piece of generated text turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text for the message's content.
    Text(String),
    /// A complete call.
    Call(ToolCall),
}

/// The outcome of parsing from an opening marker.
enum Parsed {
    /// Calls (possibly none: a marker that only closes a block) and the bytes they took.
    Calls(Vec<ToolCall>, usize),
    /// The call is not complete yet.
    More,
    /// The marker does not open a call: it is text.
    NotACall,
}

/// Splits one choice's generated text into content and calls.
#[derive(Debug)]
pub struct ToolParser {
    format: ToolFormat,
    /// Per tool, the arguments whose schema is a string (GLM-4.5 writes those raw).
    string_args: HashMap<String, Vec<String>>,
    /// The tools' names: a bare JSON call must name one of them.
    names: Vec<String>,
    buf: String,
    in_call: bool,
    /// Whether text other than whitespace has been released: a bare call must come first.
    content: bool,
    /// Trailing whitespace of the text so far, released only if text follows.
    held: String,
    calls: usize,
}

impl ToolParser {
    /// A parser for `format`; `tools` tell GLM-4.5's string arguments from the others.
    pub fn new(format: ToolFormat, tools: &[ToolSpec]) -> ToolParser {
        let string_args = tools
            .iter()
            .map(|t| {
                let names = properties(&t.parameters)
                    .into_iter()
                    .flatten()
                    .filter(|(_, s)| s.get("type").and_then(Value::as_str) == Some("string"))
                    .map(|(k, _)| k.clone())
                    .collect();
                (t.name.clone(), names)
            })
            .collect();
        ToolParser {
            format,
            string_args,
            names: tools.iter().map(|t| t.name.clone()).collect(),
            buf: String::new(),
            in_call: false,
            content: false,
            held: String::new(),
            calls: 0,
        }
    }

    /// Calls found so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds generated text; returns what it completes.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.scan(false, &mut out);
        out
    }

    /// Ends the text: a call still open is parsed as far as it goes (a model may stop
    /// without the closing marker), else released as text.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.scan(true, &mut out);
        let rest = std::mem::take(&mut self.buf);
        self.text(&rest, &mut out);
        if self.calls == 0 && !self.held.is_empty() {
            out.push(ToolEvent::Text(std::mem::take(&mut self.held)));
        }
        out
    }

    fn scan(&mut self, last: bool, out: &mut Vec<ToolEvent>) {
        loop {
            if !self.in_call && self.format == ToolFormat::Hermes && !self.content {
                match self.bare_call(last) {
                    Parsed::Calls(calls, used) => {
                        self.take_calls(calls, used, out);
                        continue;
                    }
                    Parsed::More => return,
                    Parsed::NotACall => {}
                }
            }
            if !self.in_call {
                let markers = markers(self.format);
                let found = markers.iter().filter_map(|m| self.buf.find(m)).min();
                if let Some(i) = found {
                    let before: String = self.buf.drain(..i).collect();
                    self.text(&before, out);
                    self.in_call = true;
                    continue;
                }
                let keep = if last {
                    0
                } else {
                    held_prefix(&self.buf, markers)
                };
                let release: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.text(&release, out);
                return;
            }
            match self.parse(last) {
                Parsed::Calls(calls, used) => {
                    self.in_call = false;
                    self.take_calls(calls, used, out);
                }
                Parsed::More => return,
                Parsed::NotACall => {
                    // The marker is text: release its first character and look again after it.
                    let n = self.buf.chars().next().map_or(0, char::len_utf8);
                    let first: String = self.buf.drain(..n).collect();
                    self.text(&first, out);
                    self.in_call = false;
                }
            }
        }
    }

    /// Emits the calls parsed from the first `used` bytes of the buffer; whitespace held
    /// before them is dropped.
    fn take_calls(&mut self, calls: Vec<ToolCall>, used: usize, out: &mut Vec<ToolEvent>) {
        self.buf.drain(..used);
        if !calls.is_empty() {
            self.held.clear();
        }
        self.calls += calls.len();
        out.extend(calls.into_iter().map(ToolEvent::Call));
    }

    /// Releases text, holding back trailing whitespace.
    fn text(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        let body = text.trim_end().len();
        if body == 0 {
            self.held.push_str(text);
            return;
        }
        self.content = true;
        let mut t = std::mem::take(&mut self.held);
        t.push_str(&text[..body]);
        self.held.push_str(&text[body..]);
        match out.last_mut() {
            Some(ToolEvent::Text(prev)) => prev.push_str(&t),
            _ => out.push(ToolEvent::Text(t)),
        }
    }

    fn parse(&self, last: bool) -> Parsed {
        let s = self.buf.as_str();
        match self.format {
            ToolFormat::Hermes | ToolFormat::Generic => {
                tagged(s, last, |inner| json_call(inner, "arguments"))
            }
            ToolFormat::Glm45 => tagged(s, last, |inner| self.glm_call(inner)),
            ToolFormat::DeepSeekV3 => deepseek(s, last),
            ToolFormat::Mistral => mistral(s, last),
            ToolFormat::Llama3 => llama3(s, last),
        }
    }

    /// A call without its `<tool_call>` tags at the start of the reply, bare or in a
    /// ```` ```json ```` fence: `{"name": TOOL, "arguments": {...}}` naming one of the
    /// request's tools. Small Hermes-template models (Qwen2.5-Coder) often write calls so,
    /// and llama.cpp's server reads them as calls too.
    fn bare_call(&self, last: bool) -> Parsed {
        const FENCE: &str = "```";
        let more = if last { Parsed::NotACall } else { Parsed::More };
        let s = self.buf.trim_start();
        let (fenced, t) = match s.strip_prefix(FENCE) {
            Some(r) if !last && r.len() < 4 && "json".starts_with(r) => return Parsed::More,
            Some(r) => (true, r.strip_prefix("json").unwrap_or(r)),
            None if FENCE.starts_with(s) => return more,
            None => (false, s),
        };
        let t = t.trim_start();
        if t.is_empty() {
            return more;
        }
        if !t.starts_with('{') {
            return Parsed::NotACall;
        }
        let at = self.buf.len() - t.len();
        let (v, used) = match json_prefix(t) {
            Ok(parsed) => parsed,
            Err(true) => return more,
            Err(false) => return Parsed::NotACall,
        };
        let Some(call) = call_from_value(&v, &["arguments", "parameters"])
            .filter(|c| self.names.contains(&c.name))
        else {
            return Parsed::NotACall;
        };
        let mut end = at + used;
        if fenced {
            let rest = &self.buf[end..];
            let r = rest.trim_start();
            if r.starts_with(FENCE) {
                end += rest.len() - r.len() + FENCE.len();
            } else if !last && FENCE.starts_with(r) {
                return Parsed::More;
            }
        }
        Parsed::Calls(vec![call], end)
    }

    /// `NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...`
    fn glm_call(&self, inner: &str) -> Option<ToolCall> {
        let (name, mut rest) = inner.split_at(inner.find("<arg_key>").unwrap_or(inner.len()));
        let name = name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return None;
        }
        let strings = self.string_args.get(name);
        let mut args = Map::new();
        loop {
            rest = rest.trim_start();
            if rest.is_empty() {
                break;
            }
            let (key, r) = rest.strip_prefix("<arg_key>")?.split_once("</arg_key>")?;
            let (value, r) = r
                .trim_start()
                .strip_prefix("<arg_value>")?
                .split_once("</arg_value>")?;
            let key = key.trim();
            let value = if strings.is_some_and(|s| s.iter().any(|k| k == key)) {
                Value::String(value.to_string())
            } else {
                serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))
            };
            args.insert(key.to_string(), value);
            rest = r;
        }
        Some(ToolCall {
            name: name.to_string(),
            arguments: Value::Object(args).to_string(),
        })
    }
}

/// The markers that may open a call (or, for DeepSeek-V3, close a block of calls).
fn markers(format: ToolFormat) -> &'static [&'static str] {
    match format {
        ToolFormat::Hermes | ToolFormat::Generic | ToolFormat::Glm45 => &["<tool_call>"],
        ToolFormat::DeepSeekV3 => &[DS_CALLS_BEGIN, DS_CALL_BEGIN, DS_CALLS_END],
        // Decoding drops `[TOOL_CALLS]` where it is a special token: the array alone opens too.
        ToolFormat::Mistral => &["[TOOL_CALLS]", "[{\"name\""],
        ToolFormat::Llama3 => &["<|python_tag|>", "{\"name\""],
    }
}

/// Length of the longest suffix of `buf` that may still grow into a marker.
fn held_prefix(buf: &str, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    (1..longest.min(buf.len() + 1))
        .rev()
        .find(|&k| {
            let start = buf.len() - k;
            buf.is_char_boundary(start) && markers.iter().any(|m| m.starts_with(&buf[start..]))
        })
        .unwrap_or(0)
}

/// `<tool_call>INNER</tool_call>`, INNER read by `call`.
fn tagged(s: &str, last: bool, call: impl Fn(&str) -> Option<ToolCall>) -> Parsed {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let body = &s[OPEN.len()..];
    let (inner, used) = match body.find(CLOSE) {
        Some(e) => (&body[..e], OPEN.len() + e + CLOSE.len()),
        None if last => (body, s.len()),
        None => return Parsed::More,
    };
    match call(inner) {
        Some(c) => Parsed::Calls(vec![c], used),
        None => Parsed::NotACall,
    }
}

/// `{"name": ..., ARGS_KEY: {...}}` (arguments may also be a string holding the object).
fn json_call(text: &str, args_key: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    call_from_value(&v, &[args_key])
}

fn call_from_value(v: &Value, args_keys: &[&str]) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?;
    let args = args_keys.iter().find_map(|k| v.get(*k))?;
    Some(ToolCall {
        name: name.to_string(),
        arguments: arguments_text(args)?,
    })
}

/// Arguments as JSON object text, from an object or a string that holds one.
fn arguments_text(args: &Value) -> Option<String> {
    match args {
        Value::Object(_) => Some(args.to_string()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => Some(v.to_string()),
            _ => None,
        },
        _ => None,
    }
}

/// One JSON value at the start of `s`: the value and the bytes it took, `Err(true)` when
/// `s` ends inside it, `Err(false)` when it is not JSON.
fn json_prefix(s: &str) -> Result<(Value, usize), bool> {
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    match it.next() {
        Some(Ok(v)) => Ok((v, it.byte_offset())),
        Some(Err(e)) => Err(e.is_eof()),
        None => Err(true),
    }
}

/// Whitespace at the start of `s`, in bytes.
fn leading_ws(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

/// DeepSeek-V3: one call per `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`, inside an
/// optional `<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>` block.
fn deepseek(s: &str, last: bool) -> Parsed {
    let mut i = if s.starts_with(DS_CALLS_BEGIN) {
        DS_CALLS_BEGIN.len()
    } else {
        0
    };
    i += leading_ws(&s[i..]);
    let t = &s[i..];
    if t.starts_with(DS_CALLS_END) {
        return Parsed::Calls(Vec::new(), i + DS_CALLS_END.len());
    }
    if let Some(body) = t.strip_prefix(DS_CALL_BEGIN) {
        let (inner, used) = match body.find(DS_CALL_END) {
            Some(e) => (&body[..e], i + DS_CALL_BEGIN.len() + e + DS_CALL_END.len()),
            None if last => (body, s.len()),
            None => return Parsed::More,
        };
        return match deepseek_call(inner) {
            Some(c) => Parsed::Calls(vec![c], used),
            None => Parsed::NotACall,
        };
    }
    if !last && (DS_CALL_BEGIN.starts_with(t) || DS_CALLS_END.starts_with(t)) {
        return Parsed::More;
    }
    // An opening marker followed by something else: the block is over.
    Parsed::Calls(Vec::new(), i)
}

/// `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` (V3) or `NAME<｜tool▁sep｜>ARGS` (V3.1).
fn deepseek_call(inner: &str) -> Option<ToolCall> {
    let (kind, rest) = inner.split_once(DS_SEP)?;
    let (name, args) = if kind.trim() == "function" {
        let (name, args) = rest.split_once('\n')?;
        let args = args.trim();
        let args = args.strip_prefix("```json").unwrap_or(args);
        let args = args.strip_suffix("```").unwrap_or(args);
        (name, args)
    } else {
        (kind, rest)
    };
    let v: Value = serde_json::from_str(args.trim()).ok()?;
    Some(ToolCall {
        name: name.trim().to_string(),
        arguments: arguments_text(&v)?,
    })
}

/// Mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`, or the newer
/// `[TOOL_CALLS]NAME[ARGS]{...}`.
fn mistral(s: &str, last: bool) -> Parsed {
    const MARK: &str = "[TOOL_CALLS]";
    let mark = if s.starts_with(MARK) { MARK.len() } else { 0 };
    let start = mark + leading_ws(&s[mark..]);
    let t = &s[start..];
    if t.is_empty() {
        return if last { Parsed::NotACall } else { Parsed::More };
    }
    if t.starts_with('[') {
        return match json_prefix(t) {
            Ok((Value::Array(items), used)) => {
                let calls: Option<Vec<ToolCall>> = items
                    .iter()
                    .map(|v| call_from_value(v, &["arguments", "parameters"]))
                    .collect();
                match calls {
                    Some(calls) if !calls.is_empty() => Parsed::Calls(calls, start + used),
                    _ => Parsed::NotACall,
                }
            }
            Err(true) if !last => Parsed::More,
            _ => Parsed::NotACall,
        };
    }
    let Some((name, rest)) = t.split_once("[ARGS]") else {
        let plausible = t.len() < 128 && !t.contains(char::is_whitespace);
        return if plausible && !last {
            Parsed::More
        } else {
            Parsed::NotACall
        };
    };
    let args_at = start + name.len() + "[ARGS]".len();
    match json_prefix(rest) {
        Ok((v, used)) => match arguments_text(&v) {
            Some(arguments) => Parsed::Calls(
                vec![ToolCall {
                    name: name.trim().to_string(),
                    arguments,
                }],
                args_at + used,
            ),
            None => Parsed::NotACall,
        },
        Err(true) if !last => Parsed::More,
        _ => Parsed::NotACall,
    }
}

/// Llama 3.x: `{"name": ..., "parameters": {...}}`, after an optional `<|python_tag|>`,
/// several separated by `;`.
fn llama3(s: &str, last: bool) -> Parsed {
    let mut i = s
        .strip_prefix("<|python_tag|>")
        .map_or(0, |_| "<|python_tag|>".len());
    i += leading_ws(&s[i..]);
    let t = &s[i..];
    if t.is_empty() {
        return if last { Parsed::NotACall } else { Parsed::More };
    }
    let (v, used) = match json_prefix(t) {
        Ok(x) => x,
        Err(true) if !last => return Parsed::More,
        Err(_) => return Parsed::NotACall,
    };
    let Some(call) = call_from_value(&v, &["parameters", "arguments"]) else {
        return Parsed::NotACall;
    };
    let mut end = i + used;
    let after = &s[end..];
    let sep = after.trim_start();
    if sep.is_empty() && !last {
        // A `;` and another call may follow.
        return Parsed::More;
    }
    if let Some(rest) = sep.strip_prefix(';') {
        end = s.len() - rest.len();
    }
    Parsed::Calls(vec![call], end)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tools() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}}}),
        }]
    }

    fn call(name: &str, args: Value) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.to_string(),
        }
    }

    /// Parses `text` whole, in two chunks split at every character, and one character at a
    /// time; all must give `text_want` as content and `calls_want`.
    fn check(format: ToolFormat, text: &str, text_want: &str, calls_want: &[ToolCall]) {
        let run = |chunks: &[&str]| {
            let mut p = ToolParser::new(format, &tools());
            let mut events: Vec<ToolEvent> = chunks.iter().flat_map(|c| p.push(c)).collect();
            events.extend(p.finish());
            let mut content = String::new();
            let mut calls = Vec::new();
            for e in events {
                match e {
                    ToolEvent::Text(t) => content.push_str(&t),
                    ToolEvent::Call(c) => calls.push(c),
                }
            }
            assert_eq!(p.calls(), calls.len());
            (content, calls)
        };
        let want = (text_want.to_string(), calls_want.to_vec());
        assert_eq!(run(&[text]), want, "{format:?} whole: {text}");
        for (i, _) in text.char_indices().skip(1) {
            let got = run(&[&text[..i], &text[i..]]);
            assert_eq!(got, want, "{format:?} split at {i}: {text}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(&pieces), want, "{format:?} by character: {text}");
    }

    #[test]
    fn written_calls_parse_back_in_every_format() {
        let calls = [
            call("get_weather", json!({"city": "Paris", "days": 3})),
            call("get_weather", json!({"city": "Oslo"})),
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
            check(format, &text, "", &calls);
            check(
                format,
                &format!("Let me check.\n{text}"),
                "Let me check.",
                &calls,
            );
        }
    }

    #[test]
    fn hermes_outputs() {
        let paris = call("get_weather", json!({"city": "Paris"}));
        // Qwen2.5-Instruct's shape: text, then calls on their own lines.
        check(
            ToolFormat::Hermes,
            "I'll look that up.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n",
            "I'll look that up.",
            std::slice::from_ref(&paris),
        );
        // Arguments as a JSON string, and a call cut off by the end of generation.
        check(
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}",
            "",
            std::slice::from_ref(&paris),
        );
        // Not a call: the tags stay text.
        check(
            ToolFormat::Hermes,
            "Use <tool_call>like this</tool_call> to call.",
            "Use <tool_call>like this</tool_call> to call.",
            &[],
        );
        check(ToolFormat::Hermes, "a < b <tool", "a < b <tool", &[]);
        // Qwen2.5-Coder-0.5B's shape with `tool_choice: auto` (recorded from the GGUF):
        // the call without its tags, bare or fenced, one or several.
        let oslo = call("get_weather", json!({"city": "Oslo"}));
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
        // Not calls: JSON that names no tool, JSON after text, and text that is not JSON.
        let other = "{\"name\": \"Ada\", \"arguments\": {\"x\": 1}}";
        check(ToolFormat::Hermes, other, other, &[]);
        let late = "Call it as {\"name\": \"get_weather\", \"arguments\": {}}";
        check(ToolFormat::Hermes, late, late, &[]);
        check(
            ToolFormat::Hermes,
            "{braces} and ``` fences",
            "{braces} and ``` fences",
            &[],
        );
        check(
            ToolFormat::Hermes,
            "```python\nprint(1)\n```",
            "```python\nprint(1)\n```",
            &[],
        );
        check(ToolFormat::Hermes, "plain answer\n", "plain answer\n", &[]);
    }

    #[test]
    fn deepseek_outputs() {
        let paris = call("get_weather", json!({"city": "Paris"}));
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
            &[call("get_weather", json!({"city": "123", "days": 2}))],
        );
    }

    #[test]
    fn mistral_outputs() {
        let paris = call("get_weather", json!({"city": "Paris"}));
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
            &[call("get_weather", json!({"city": "Paris"}))],
        );
        check(
            ToolFormat::Llama3,
            "The JSON {\"name\": \"x\"} has no parameters.",
            "The JSON {\"name\": \"x\"} has no parameters.",
            &[],
        );
    }
}
