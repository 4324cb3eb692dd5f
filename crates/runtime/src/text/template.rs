//! Chat templates: a conversation rendered into a prompt as `transformers` renders it.
//!
//! [`ChatTemplate`] compiles a Hugging Face Jinja chat template with minijinja and renders
//! [`ChatMessage`]s (or arbitrary JSON messages, for tool calls) into the prompt text.
//!
//! A key design decision made here is to reproduce the environment `transformers` builds
//! (`apply_chat_template`), not plain Jinja: `trim_blocks` and `lstrip_blocks` on, Python
//! string and dict methods (`.strip()`, `.startswith()`, `.split()`, `.items()`) through
//! minijinja-contrib's pycompat, `raise_exception`, `strftime_now`, `tools` and `documents`
//! defined as `none`, and a `tojson` that writes what Python's `json.dumps` writes
//! (`", "` and `": "` separators, no HTML escaping), because templates are written and
//! tested against that environment and a one-character difference changes the tokens.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use serde::Serialize;

use super::TextError;

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message's text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    origin: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles a template. `bos_token` and `eos_token` become the template variables of
    /// those names (left undefined when `None`, as `transformers` does); `origin` names
    /// where the template came from, for error messages.
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
        origin: &str,
    ) -> Result<Self, TextError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| template_error(origin, &e))?;
        env.set_syntax(syntax);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| template_error(origin, &e))?;
        Ok(Self {
            env,
            origin: origin.to_string(),
            bos_token: bos_token.map(str::to_string),
            eos_token: eos_token.map(str::to_string),
        })
    }

    /// Renders a conversation. With `add_generation_prompt`, the prompt ends with the
    /// opening of an assistant turn, ready for generation.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.render_value(
            Value::from(Serde(messages)),
            add_generation_prompt,
            BTreeMap::new(),
        )
    }

    /// Renders messages given as JSON (an array of objects with at least `role`; `content`
    /// may be null and other fields such as `tool_calls` pass through). `extra` adds or
    /// overrides template variables (`tools`, `enable_thinking`, ...).
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TextError> {
        let extra = extra
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(Serde(v))))
            .collect();
        self.render_value(Value::from(Serde(messages)), add_generation_prompt, extra)
    }

    fn render_value(
        &self,
        messages: Value,
        add_generation_prompt: bool,
        extra: BTreeMap<String, Value>,
    ) -> Result<String, TextError> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        ctx.insert("messages".into(), messages);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token".into(), Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token".into(), Value::from(eos.as_str()));
        }
        ctx.extend(extra);
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&self.origin, &e))?;
        template
            .render(Value::from(ctx))
            .map_err(|e| template_error(&self.origin, &e))
    }
}

fn template_error(origin: &str, e: &Error) -> TextError {
    let mut message = e.to_string();
    if let Some(detail) = e.detail()
        && !message.contains(detail)
    {
        let _ = write!(message, ": {detail}");
    }
    TextError::Template {
        origin: origin.to_string(),
        message,
    }
}

/// `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current time, formatted. `transformers` uses local time;
/// we use UTC (no time zone database here), which differs only around midnight.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    strftime(&format, secs).map(Value::from)
}

/// Formats a UTC time (seconds since 1970) with the common C `strftime` directives:
/// `%Y %y %m %d %e %B %b %A %a %H %I %M %S %p %j %%`.
pub(crate) fn strftime(format: &str, unix_secs: i64) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let is_leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let year_day = CUMULATIVE[month as usize - 1] + day + u32::from(is_leap && month > 2);
    let (hour, minute, second) = (
        secs_of_day / 3600,
        (secs_of_day / 60) % 60,
        secs_of_day % 60,
    );

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let directive = chars.next().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                "strftime format ends with a lone %",
            )
        })?;
        let month_name = MONTHS[month as usize - 1];
        let day_name = DAYS[weekday];
        let _ = match directive {
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year.rem_euclid(100)),
            'm' => write!(out, "{month:02}"),
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:2}"),
            'B' => write!(out, "{month_name}"),
            'b' | 'h' => write!(out, "{}", &month_name[..3]),
            'A' => write!(out, "{day_name}"),
            'a' => write!(out, "{}", &day_name[..3]),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{:02}", (hour + 11) % 12 + 1),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'j' => write!(out, "{year_day:03}"),
            '%' => write!(out, "%"),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime directive %{other} is not supported"),
                ));
            }
        };
    }
    Ok(out)
}

/// Days since 1970-01-01 to (year, month 1..=12, day 1..=31), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The `tojson` filter of `transformers`: Python's
/// `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(usize::try_from(n.max(0)).unwrap_or(0))),
            (None, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be a number or a string",
                ));
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let a = v.get_item_by_index(0)?;
            let b = v.get_item_by_index(1)?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ));
                }
            }
        }
        // Python drops the space after "," when indenting.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl JsonStyle {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    use minijinja::value::ValueKind;
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                let f = f64::try_from(value.clone())?;
                write_python_float(out, f);
            }
        }
        ValueKind::String => {
            write_json_string(out, value.as_str().unwrap_or(""), style.ensure_ascii)
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                style.newline(out, depth + 1);
                // Python converts non-string keys with str(); JSON needs a string.
                match key.as_str() {
                    Some(s) => write_json_string(out, s, style.ensure_ascii),
                    None => write_json_string(out, &key.to_string(), style.ensure_ascii),
                }
                out.push_str(&style.key_sep);
                write_json(out, &value.get_item(key)?, style, depth + 1)?;
            }
            style.newline(out, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                style.newline(out, depth + 1);
                write_json(out, item, style, depth + 1)?;
            }
            style.newline(out, depth);
            out.push(']');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of kind {}", value.kind()),
            ));
        }
    }
    Ok(())
}

/// A float as Python's `repr` writes it: `1.0`, `0.5`, `1e-05`, `1e+20`.
fn write_python_float(out: &mut String, f: f64) {
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f == 0.0 || (1e-4..1e16).contains(&f.abs()) {
        let s = format!("{f}");
        out.push_str(&s);
        if !s.contains('.') {
            out.push_str(".0");
        }
    } else {
        let s = format!("{f:e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exponent.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exponent),
        };
        let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
    }
}

fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_expr(expr: &str) -> String {
        let t = ChatTemplate::new(&format!("{{{{ {expr} }}}}"), None, None, "test").unwrap();
        t.render(&[], false).unwrap()
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        // Expected strings written by Python 3: json.dumps(x, ensure_ascii=False, ...).
        assert_eq!(
            render_expr(r#"{"a": [1, 2.5, none, true], "b": "x\"y\nü"}|tojson"#),
            r#"{"a": [1, 2.5, null, true], "b": "x\"y\nü"}"#
        );
        assert_eq!(
            render_expr(r#"{"a": [1, {}], "b": []}|tojson(indent=2)"#),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"
        );
        assert_eq!(
            render_expr(r#""é😀"|tojson(ensure_ascii=true)"#),
            r#""\u00e9\ud83d\ude00""#
        );
        assert_eq!(
            render_expr("[1.0, 1e-05, 1e20, 0.0001]|tojson"),
            "[1.0, 1e-05, 1e+20, 0.0001]"
        );
        assert_eq!(
            render_expr(r#"{"b": 1, "a": 2}|tojson(sort_keys=true, separators=[",", ":"])"#),
            r#"{"a":2,"b":1}"#
        );
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday (checked with Python's datetime).
        let t = 1_709_211_909;
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A %a %B %b %j %I%p %y %%", t).unwrap(),
            "2024-02-29 13:05:09 Thursday Thu February Feb 060 01PM 24 %"
        );
        assert_eq!(strftime("%d %b %Y", 0).unwrap(), "01 Jan 1970");
        assert_eq!(strftime("%Y-%m-%d", -86_400).unwrap(), "1969-12-31");
        assert!(strftime("%Q", 0).is_err());
        assert!(strftime("50%", 0).is_err());
    }

    #[test]
    fn raise_exception_becomes_an_error_with_the_message() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok",
            None,
            None,
            "test template",
        )
        .unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "hi")], false).unwrap(),
            "ok"
        );
        let err = t
            .render(&[ChatMessage::new("assistant", "hi")], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("test template"), "{err}");
        assert!(err.contains("first message must be from the user"), "{err}");
    }

    #[test]
    fn syntax_errors_name_the_origin() {
        let err = ChatTemplate::new("{% for %}", None, None, "model/tokenizer_config.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("model/tokenizer_config.json"), "{err}");
    }
}
