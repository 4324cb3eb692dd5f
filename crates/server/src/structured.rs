//! Structured outputs on the generation endpoints: `response_format` checked field by field
//! and compiled into the runtime's [`Grammar`].
//!
//! A key design decision made here is that every error names the exact field at fault
//! (`response_format.json_schema.name`, `response_format.json_schema.schema`) and, for a
//! schema the grammar engine cannot enforce, the keywords it refused: a client that asked
//! for a shape must learn at once that it will not get it, rather than receive text that
//! does not match.

use std::sync::Arc;

use serde_json::Value;
use strata_runtime::grammar::{Grammar, GrammarError, ResponseFormat};

use crate::AppState;
use crate::api::Common;
use crate::error::ApiError;

/// Compiles the request's `response_format`, off the async workers (the first request
/// also builds the token trie).
pub(crate) async fn grammar(st: &Arc<AppState>, c: &Common) -> Result<Option<Grammar>, ApiError> {
    let Some(format) = response_format(c.response_format.as_ref())? else {
        return Ok(None);
    };
    let param = match format {
        ResponseFormat::JsonObject => "response_format",
        ResponseFormat::JsonSchema(_) | ResponseFormat::Lark(_) => {
            "response_format.json_schema.schema"
        }
    };
    let engine = Arc::clone(&st.engine);
    let compiled = tokio::task::spawn_blocking(move || engine.compile_format(&format))
        .await
        .map_err(|e| {
            tracing::error!("grammar compilation task failed: {e}");
            ApiError::internal()
        })?;
    match compiled {
        Ok(g) => Ok(Some(g)),
        Err(GrammarError::Schema(m)) => {
            Err(ApiError::invalid(format!("{param} cannot be enforced: {m}")).param(param))
        }
        Err(e @ (GrammarError::Tokenizer { .. } | GrammarError::NoEos { .. })) => Err(
            ApiError::invalid(format!("this model cannot produce structured outputs: {e}"))
                .param("response_format"),
        ),
        Err(e @ GrammarError::Engine(_)) => {
            tracing::error!("grammar compilation failed: {e}");
            Err(ApiError::internal())
        }
    }
}

/// Longest `response_format.json_schema.name` (OpenAI's limit).
const MAX_SCHEMA_NAME: usize = 64;

/// `response_format`: `None` for plain text; errors name the field at fault.
pub fn response_format(v: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
    let invalid = |param: &str, msg: String| ApiError::invalid(msg).param(param);
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(obj) = v.as_object() else {
        return Err(invalid(
            "response_format",
            format!("response_format must be an object with a 'type', got {v}"),
        ));
    };
    let kind = match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(other) => {
            return Err(invalid(
                "response_format.type",
                format!("response_format.type must be a string, got {other}"),
            ));
        }
        None => {
            return Err(invalid(
                "response_format.type",
                "response_format.type is missing".into(),
            ));
        }
    };
    let allowed: &[&str] = match kind {
        "text" | "json_object" => &["type"],
        "json_schema" => &["type", "json_schema"],
        other => {
            return Err(invalid(
                "response_format.type",
                format!(
                    "unknown response_format.type '{other}': expected 'text', 'json_object' or 'json_schema'"
                ),
            ));
        }
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(invalid(
            &format!("response_format.{k}"),
            format!("unrecognized field response_format.{k} for type '{kind}'"),
        ));
    }
    match kind {
        "text" => return Ok(None),
        "json_object" => return Ok(Some(ResponseFormat::JsonObject)),
        _ => {}
    }
    let param = "response_format.json_schema";
    let Some(js) = obj.get("json_schema").and_then(Value::as_object) else {
        return Err(invalid(
            param,
            format!("{param} must be an object with a 'name' and a 'schema'"),
        ));
    };
    if let Some(k) = js
        .keys()
        .find(|k| !["name", "description", "schema", "strict"].contains(&k.as_str()))
    {
        return Err(invalid(
            &format!("{param}.{k}"),
            format!("unrecognized field {param}.{k}"),
        ));
    }
    let name = js.get("name").and_then(Value::as_str).unwrap_or_default();
    let name_ok = (1..=MAX_SCHEMA_NAME).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !name_ok {
        return Err(invalid(
            &format!("{param}.name"),
            format!(
                "{param}.name must be 1 to {MAX_SCHEMA_NAME} letters, digits, underscores or dashes, got {}",
                js.get("name").map_or("nothing".into(), Value::to_string)
            ),
        ));
    }
    if let Some(d) = js
        .get("description")
        .filter(|d| !d.is_string() && !d.is_null())
    {
        return Err(invalid(
            &format!("{param}.description"),
            format!("{param}.description must be a string, got {d}"),
        ));
    }
    if let Some(s) = js.get("strict").filter(|s| !s.is_boolean() && !s.is_null()) {
        return Err(invalid(
            &format!("{param}.strict"),
            format!("{param}.strict must be a boolean, got {s}"),
        ));
    }
    // Every schema is enforced, `strict` or not: a schema the grammar cannot enforce is
    // refused rather than followed loosely.
    match js.get("schema") {
        Some(schema @ Value::Object(_)) | Some(schema @ Value::Bool(true)) => {
            Ok(Some(ResponseFormat::JsonSchema(schema.clone())))
        }
        Some(other) => Err(invalid(
            &format!("{param}.schema"),
            format!("{param}.schema must be a JSON Schema object, got {other}"),
        )),
        None => Err(invalid(
            &format!("{param}.schema"),
            format!("{param}.schema is missing"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Parses `v` and checks the error's parameter (or, with `None`, that it parses).
    fn check(v: Value, param: Option<&str>) {
        match (response_format(Some(&v)), param) {
            (Ok(_), None) => {}
            (Ok(f), Some(p)) => panic!("{v} parsed as {f:?}, expected an error on {p}"),
            (Err(e), want) => {
                assert_eq!(e.status, 400, "{v}");
                assert_eq!(e.param.as_deref(), want, "{v}: {}", e.message);
                assert!(e.message.contains(want.unwrap_or("")), "{}", e.message);
            }
        }
    }

    #[test]
    fn malformed_response_formats_name_the_field() {
        let schema = json!({"type": "object"});
        check(json!({"type": "text"}), None);
        check(json!({"type": "json_object"}), None);
        check(
            json!({"type": "json_schema", "json_schema": {"name": "a-b_1", "schema": schema, "strict": true}}),
            None,
        );
        check(json!("json"), Some("response_format"));
        check(json!({}), Some("response_format.type"));
        check(json!({"type": 3}), Some("response_format.type"));
        check(json!({"type": "xml"}), Some("response_format.type"));
        check(
            json!({"type": "json_object", "schema": {}}),
            Some("response_format.schema"),
        );
        check(
            json!({"type": "json_schema"}),
            Some("response_format.json_schema"),
        );
        check(
            json!({"type": "json_schema", "json_schema": {"schema": schema}}),
            Some("response_format.json_schema.name"),
        );
        check(
            json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": schema}}),
            Some("response_format.json_schema.name"),
        );
        check(
            json!({"type": "json_schema", "json_schema": {"name": "a"}}),
            Some("response_format.json_schema.schema"),
        );
        check(
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}),
            Some("response_format.json_schema.schema"),
        );
        check(
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": "yes"}}),
            Some("response_format.json_schema.strict"),
        );
        check(
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "extra": 1}}),
            Some("response_format.json_schema.extra"),
        );
        assert_eq!(response_format(None), Ok(None));
        assert_eq!(response_format(Some(&Value::Null)), Ok(None));
    }
}
