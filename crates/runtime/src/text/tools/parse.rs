//! Generated text back into tool calls, chunk by chunk.
//!
//! [`ToolParser`] scans for the format's opening markers; text that cannot be part of a
//! marker is released at once, a possible marker prefix is held back, and from a marker
//! on the text is parsed again as it grows. A call starts ([`ToolEvent::CallStart`]) as
//! soon as its name and the start of its arguments are out, and its arguments follow in
//! pieces ([`ToolEvent::Arguments`]) as the model writes them. Text that turns out not to
//! be a call is released as text. Whitespace around calls is dropped, as vLLM and
//! llama.cpp do.
//!
//! A key design decision made here is that streamed arguments are the model's own text of
//! the arguments object, cut where JSON says the object ends (serde_json reads the prefix
//! again as it grows): nothing is held back, since a brace inside the object cannot be the
//! wrapper's, and the pieces add up to exactly the arguments of the finished call. Once a
//! call has started it stays a call: arguments that stop being JSON end at their last valid
//! byte, as a call cut off by the token limit does. Arguments written other ways (a JSON
//! string, keys in another order) are parsed whole when the call is complete and sent in
//! one piece, as compact JSON.

use std::collections::HashMap;

use serde_json::Value;

use super::{
    DS_CALL_BEGIN, DS_CALL_END, DS_CALLS_BEGIN, DS_CALLS_END, DS_SEP, TOOL_CLOSE, TOOL_OPEN,
    ToolCall, ToolFormat, ToolSpec, properties,
};

/// What a piece of generated text turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text for the message's content.
    Text(String),
    /// A call begins: the function's name. Its arguments follow.
    CallStart(String),
    /// The next piece of the last started call's arguments: a call's pieces add up to its
    /// arguments.
    Arguments(String),
}

/// The outcome of parsing from an opening marker.
enum Parsed {
    /// Calls (possibly none: a marker that only closes a block) and the bytes they took.
    Calls(Vec<ToolCall>, usize),
    /// The text ends inside a call: the calls so far, the last with its arguments so far.
    Open(Vec<ToolCall>),
    /// The call is not complete yet.
    More,
    /// The marker does not open a call: it is text.
    NotACall,
}

/// How far the start of a call has been read: `{"name": NAME, KEY: {`.
enum Head {
    /// The call's name, and where its arguments object starts.
    Args(String, usize),
    /// The text ends inside the head.
    More,
    /// Not a call in this shape.
    No,
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
    /// Calls of the block being parsed that have started, and the bytes of the last one's
    /// arguments sent.
    started: usize,
    sent: usize,
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
            started: 0,
            sent: 0,
        }
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds generated text; returns what it adds.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.scan(false, &mut out);
        out
    }

    /// Ends the text: a call still open ends as far as it goes (a model may stop without
    /// the closing marker), a marker that opened none is released as text.
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
                    Parsed::NotACall => {}
                    parsed => {
                        if self.take(parsed, out) {
                            continue;
                        }
                        return;
                    }
                }
            }
            if !self.in_call {
                let markers = openers(self.format);
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
                Parsed::NotACall => {
                    // The marker is text: release its first character and look again after it.
                    let n = self.buf.chars().next().map_or(0, char::len_utf8);
                    let first: String = self.buf.drain(..n).collect();
                    self.text(&first, out);
                    self.in_call = false;
                }
                parsed => {
                    if !self.take(parsed, out) {
                        return;
                    }
                    self.in_call = false;
                }
            }
        }
    }

    /// Emits what `parsed` adds to the calls sent so far; returns whether the block is
    /// complete (its text then taken out of the buffer).
    fn take(&mut self, parsed: Parsed, out: &mut Vec<ToolEvent>) -> bool {
        let (calls, used) = match parsed {
            Parsed::Calls(calls, used) => (calls, Some(used)),
            Parsed::Open(calls) => (calls, None),
            Parsed::More | Parsed::NotACall => return false,
        };
        // The text is parsed again from the marker each time: calls before the last
        // started one were sent whole, the last one grew.
        for (i, call) in calls.into_iter().enumerate().skip(self.started.max(1) - 1) {
            if i == self.started {
                if self.started == 0 {
                    self.held.clear();
                }
                out.push(ToolEvent::CallStart(call.name));
                self.started += 1;
                self.calls += 1;
                self.sent = 0;
            }
            if let Some(piece) = call.arguments.get(self.sent..).filter(|p| !p.is_empty()) {
                out.push(ToolEvent::Arguments(piece.to_string()));
                self.sent = call.arguments.len();
            }
        }
        let Some(used) = used else {
            return false;
        };
        self.buf.drain(..used);
        self.started = 0;
        self.sent = 0;
        true
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
            ToolFormat::Hermes | ToolFormat::Generic => hermes(s, last),
            ToolFormat::Glm45 => self.glm(s, last),
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
        let buf = self.buf.as_str();
        let at = buf.len() - t.len();
        // After the call object, a fenced call's closing fence.
        let fence_end = |end: usize| {
            let rest = &buf[end..];
            let r = rest.trim_start();
            if !fenced {
                Some(end)
            } else if r.starts_with(FENCE) {
                Some(end + rest.len() - r.len() + FENCE.len())
            } else if !last && FENCE.starts_with(r) {
                None
            } else {
                Some(end)
            }
        };
        match json_head(t, &["arguments", "parameters"]) {
            Head::Args(name, args) if self.names.contains(&name) => {
                return streamed_call(buf, at + args, name, last, |a| {
                    fence_end(object_end(buf, at, a)?)
                });
            }
            Head::Args(..) => return Parsed::NotACall,
            Head::More if !last => return Parsed::More,
            Head::More | Head::No => {}
        }
        let (v, used) = match json_prefix(t) {
            Ok(parsed) => parsed,
            Err(true) => return more,
            Err(false) => return Parsed::NotACall,
        };
        match call_from_value(&v, &["arguments", "parameters"])
            .filter(|c| self.names.contains(&c.name))
        {
            Some(call) => match fence_end(at + used) {
                Some(end) => Parsed::Calls(vec![call], end),
                None => Parsed::More,
            },
            None => Parsed::NotACall,
        }
    }

    /// GLM-4.5: `<tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call>`.
    /// The call starts at its first `<arg_key>` (or its end); the arguments are built as
    /// compact JSON, one piece per complete pair, and closed at the end of the call.
    fn glm(&self, s: &str, last: bool) -> Parsed {
        let body = &s[TOOL_OPEN.len()..];
        let close = body.find(TOOL_CLOSE);
        let inner = &body[..close.unwrap_or(body.len())];
        let Some(name_end) = inner.find("<arg_key>").or(close.map(|_| inner.len())) else {
            return if last {
                glm_end(inner, "", s.len())
            } else {
                Parsed::More
            };
        };
        let name = inner[..name_end].trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Parsed::NotACall;
        }
        let strings = self.string_args.get(name);
        let mut args = String::from("{");
        let mut rest = &inner[name_end..];
        while let Some((key, value, r)) = glm_pair(rest) {
            let value = if strings.is_some_and(|s| s.iter().any(|k| k == key)) {
                Value::String(value.to_string())
            } else {
                serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))
            };
            if args.len() > 1 {
                args.push(',');
            }
            args.push_str(&Value::String(key.to_string()).to_string());
            args.push(':');
            args.push_str(&value.to_string());
            rest = r;
        }
        match close {
            Some(e) => glm_end(name, &args, TOOL_OPEN.len() + e + TOOL_CLOSE.len()),
            None if last => glm_end(name, &args, s.len()),
            None => Parsed::Open(vec![ToolCall {
                name: name.to_string(),
                arguments: args,
            }]),
        }
    }
}

/// A GLM-4.5 call named `name` with the pairs `args` (an unclosed object), ending at `used`.
fn glm_end(name: &str, args: &str, used: usize) -> Parsed {
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Parsed::NotACall;
    }
    let args = if args.is_empty() { "{" } else { args };
    Parsed::Calls(
        vec![ToolCall {
            name: name.to_string(),
            arguments: format!("{args}}}"),
        }],
        used,
    )
}

/// One complete `<arg_key>k</arg_key>\n<arg_value>v</arg_value>` at the start of `s`
/// (after whitespace): the key, the value and the text after it.
fn glm_pair(s: &str) -> Option<(&str, &str, &str)> {
    let (key, r) = s
        .trim_start()
        .strip_prefix("<arg_key>")?
        .split_once("</arg_key>")?;
    let (value, r) = r
        .trim_start()
        .strip_prefix("<arg_value>")?
        .split_once("</arg_value>")?;
    Some((key.trim(), value, r))
}

/// The markers that may open a call (or, for DeepSeek-V3, close a block of calls).
fn openers(format: ToolFormat) -> &'static [&'static str] {
    match format {
        ToolFormat::Hermes | ToolFormat::Generic | ToolFormat::Glm45 => &[TOOL_OPEN],
        ToolFormat::DeepSeekV3 => &[DS_CALLS_BEGIN, DS_CALL_BEGIN, DS_CALLS_END],
        // A decoder that does not keep the special `[TOOL_CALLS]`: the array alone opens too.
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

/// `{"name": NAME, KEY: {` at the start of `s` (after whitespace), KEY one of `keys`.
fn json_head(s: &str, keys: &[&str]) -> Head {
    let mut i = 0;
    let mut name = String::new();
    // The head's pieces in order: `{` "name" `:` NAME `,` KEY `:` `{`.
    for piece in 0..8 {
        i += leading_ws(&s[i..]);
        let t = &s[i..];
        if t.is_empty() {
            return Head::More;
        }
        let punct = match piece {
            0 | 7 => Some('{'),
            2 | 6 => Some(':'),
            4 => Some(','),
            _ => None,
        };
        if let Some(p) = punct {
            if !t.starts_with(p) {
                return Head::No;
            }
            if piece == 7 {
                return Head::Args(name, i);
            }
            i += 1;
            continue;
        }
        if !t.starts_with('"') {
            return Head::No;
        }
        let (word, used) = match json_prefix(t) {
            Ok((Value::String(w), used)) => (w, used),
            Err(true) => return Head::More,
            _ => return Head::No,
        };
        let fits = match piece {
            1 => word == "name",
            3 => !word.is_empty(),
            _ => keys.contains(&word.as_str()),
        };
        if !fits {
            return Head::No;
        }
        if piece == 3 {
            name = word;
        }
        i += used;
    }
    Head::No
}

/// A call named `name` whose arguments object starts at `s[at..]`, read as far as the text
/// goes. `end(e)`, given where the arguments end, finds where the call ends (`None`: not
/// in the text yet); at the end of the text the call ends there.
fn streamed_call(
    s: &str,
    at: usize,
    name: String,
    last: bool,
    end: impl Fn(usize) -> Option<usize>,
) -> Parsed {
    let args = &s[at..];
    let (len, closed) = match json_prefix(args) {
        Ok((_, used)) => (used, true),
        Err(true) => (args.len(), false),
        Err(false) => (valid_prefix(args), true),
    };
    let call = ToolCall {
        name,
        arguments: args[..len].to_string(),
    };
    match closed.then(|| end(at + len)).flatten() {
        Some(used) => Parsed::Calls(vec![call], used),
        None if last => Parsed::Calls(vec![call], s.len()),
        None => Parsed::Open(vec![call]),
    }
}

/// Where the call object at `s[from..]` ends: `None` while it is not complete; where its
/// arguments end (`args_end`) when it is not JSON.
fn object_end(s: &str, from: usize, args_end: usize) -> Option<usize> {
    match json_prefix(&s[from..]) {
        Ok((_, used)) => Some(from + used),
        Err(true) => None,
        Err(false) => Some(args_end),
    }
}

/// The end of the longest start of `s` that may still grow into JSON (`s` itself cannot).
fn valid_prefix(s: &str) -> usize {
    let starts: Vec<usize> = s.char_indices().map(|(i, _)| i).collect();
    // Every start of a valid start is valid: the first invalid one is found by bisection.
    let n = starts.partition_point(|&e| matches!(json_prefix(&s[..e]), Err(true)));
    starts[n.max(1) - 1]
}

/// Hermes: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
fn hermes(s: &str, last: bool) -> Parsed {
    let body = TOOL_OPEN.len();
    let close = |a: usize| s[a..].find(TOOL_CLOSE).map(|e| a + e + TOOL_CLOSE.len());
    match json_head(&s[body..], &["arguments"]) {
        Head::Args(name, at) => return streamed_call(s, body + at, name, last, close),
        Head::More if !last && close(body).is_none() => return Parsed::More,
        Head::More | Head::No => {}
    }
    let (inner, used) = match close(body) {
        Some(e) => (&s[body..e - TOOL_CLOSE.len()], e),
        None if last => (&s[body..], s.len()),
        None => return Parsed::More,
    };
    match json_call(inner, "arguments") {
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
        let b = i + DS_CALL_BEGIN.len();
        let close = |a: usize| s[a..].find(DS_CALL_END).map(|e| a + e + DS_CALL_END.len());
        match deepseek_head(body) {
            Head::Args(name, at) => return streamed_call(s, b + at, name, last, close),
            Head::More if !last && close(b).is_none() => return Parsed::More,
            Head::More | Head::No => {}
        }
        let (inner, used) = match close(b) {
            Some(e) => (&s[b..e - DS_CALL_END.len()], e),
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

/// The start of a DeepSeek call up to its arguments object: `function<｜tool▁sep｜>NAME\n```json\n{`
/// (V3) or `NAME<｜tool▁sep｜>{` (V3.1).
fn deepseek_head(body: &str) -> Head {
    const FENCE: &str = "```json";
    let Some((kind, rest)) = body.split_once(DS_SEP) else {
        return Head::More;
    };
    let (name, args) = if kind.trim() == "function" {
        let Some((name, after)) = rest.split_once('\n') else {
            return Head::More;
        };
        let a = after.trim_start();
        match a.strip_prefix(FENCE) {
            Some(r) => (name, r),
            None if FENCE.starts_with(a) => return Head::More,
            None => (name, a),
        }
    } else {
        (kind, rest)
    };
    let name = name.trim();
    let a = args.trim_start();
    if name.is_empty() || name.contains(char::is_whitespace) {
        Head::No
    } else if a.is_empty() {
        Head::More
    } else if a.starts_with('{') {
        Head::Args(name.to_string(), body.len() - a.len())
    } else {
        Head::No
    }
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
        return mistral_array(s, start + 1, last);
    }
    let Some((name, rest)) = t.split_once("[ARGS]") else {
        let plausible = t.len() < 128 && !t.contains(char::is_whitespace);
        return if plausible && !last {
            Parsed::More
        } else {
            Parsed::NotACall
        };
    };
    let name = name.trim().to_string();
    let r = rest.trim_start();
    if r.starts_with('{') {
        return streamed_call(s, s.len() - r.len(), name, last, Some);
    }
    if r.is_empty() && !last {
        return Parsed::More;
    }
    let args_at = s.len() - rest.len();
    match json_prefix(rest) {
        Ok((v, used)) => match arguments_text(&v) {
            Some(arguments) => Parsed::Calls(vec![ToolCall { name, arguments }], args_at + used),
            None => Parsed::NotACall,
        },
        Err(true) if !last => Parsed::More,
        _ => Parsed::NotACall,
    }
}

/// The items of a Mistral array of calls from `s[i..]` (after its `[`), each streamed as it
/// comes; the block ends at the `]`, or with the last call before an item that is none.
fn mistral_array(s: &str, mut i: usize, last: bool) -> Parsed {
    const KEYS: &[&str] = &["arguments", "parameters"];
    let mut calls = Vec::new();
    let mut end = i;
    // What the text says when it ends or stops being calls before item `calls.len()`.
    let stop = |calls: Vec<ToolCall>, at: usize, ended: bool| match (calls.is_empty(), ended) {
        (true, true) if !last => Parsed::More,
        (true, _) => Parsed::NotACall,
        (false, true) if !last => Parsed::Open(calls),
        (false, _) => Parsed::Calls(calls, at),
    };
    loop {
        let from = i + leading_ws(&s[i..]);
        let t = &s[from..];
        let item = match json_head(t, KEYS) {
            Head::Args(name, at) => {
                streamed_call(s, from + at, name, last, |a| object_end(s, from, a))
            }
            Head::More if !last => return stop(calls, end, true),
            Head::More | Head::No => match json_prefix(t) {
                Ok((v, used)) => match call_from_value(&v, KEYS) {
                    Some(call) => Parsed::Calls(vec![call], from + used),
                    None => return stop(calls, end, false),
                },
                Err(ended) => return stop(calls, end, ended),
            },
        };
        match item {
            Parsed::Calls(c, used) => {
                calls.extend(c);
                end = used;
            }
            Parsed::Open(c) => {
                calls.extend(c);
                return Parsed::Open(calls);
            }
            Parsed::More | Parsed::NotACall => return stop(calls, end, false),
        }
        let after = end + leading_ws(&s[end..]);
        match s[after..].chars().next() {
            Some(',') => i = after + 1,
            Some(']') => return Parsed::Calls(calls, after + 1),
            None if !last => return Parsed::Open(calls),
            _ => return Parsed::Calls(calls, end),
        }
    }
}

/// Llama 3.x: `{"name": ..., "parameters": {...}}`, after an optional `<|python_tag|>`,
/// several separated by `;`.
fn llama3(s: &str, last: bool) -> Parsed {
    const KEYS: &[&str] = &["parameters", "arguments"];
    let mut i = s
        .strip_prefix("<|python_tag|>")
        .map_or(0, |_| "<|python_tag|>".len());
    i += leading_ws(&s[i..]);
    let t = &s[i..];
    if t.is_empty() {
        return if last { Parsed::NotACall } else { Parsed::More };
    }
    // After the call, a `;` (another call may follow it).
    let separator = |end: usize| {
        let sep = s[end..].trim_start();
        match sep.strip_prefix(';') {
            Some(rest) => Some(s.len() - rest.len()),
            None if sep.is_empty() && !last => None,
            None => Some(end),
        }
    };
    match json_head(t, KEYS) {
        Head::Args(name, at) => {
            return streamed_call(s, i + at, name, last, |a| separator(object_end(s, i, a)?));
        }
        Head::More if !last => return Parsed::More,
        Head::More | Head::No => {}
    }
    let (v, used) = match json_prefix(t) {
        Ok(x) => x,
        Err(true) if !last => return Parsed::More,
        Err(_) => return Parsed::NotACall,
    };
    let Some(call) = call_from_value(&v, KEYS) else {
        return Parsed::NotACall;
    };
    match separator(i + used) {
        Some(end) => Parsed::Calls(vec![call], end),
        None => Parsed::More,
    }
}

#[cfg(test)]
mod tests;
