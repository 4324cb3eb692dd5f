//! Tool calls through the router on the strata-tiny-moe model: `tool_choice` "required"
//! gives a valid call, streamed as `delta.tool_calls` chunks (its name, then its arguments
//! in pieces) that add up to the non-streamed response; a history with calls and results renders.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use strata_model::Precision;
use strata_runtime::engine::Engine;
use strata_runtime::scheduler::SchedulerConfig;
use strata_server::{AppState, app};
use tower::ServiceExt;

const MODEL: &str = "strata-tiny-moe";

fn state() -> Arc<AppState> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    let engine = ENGINE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
        Arc::new(Engine::load(&dir, Precision::Fast).unwrap())
    });
    let config = SchedulerConfig {
        max_batch: 4,
        max_queue: 8,
        step_tokens: 64,
        ctx_size: 512,
        prefix_cache_bytes: 0,
    };
    Arc::new(AppState::new(engine.clone(), config, MODEL.into()))
}

fn body(extra: Value) -> String {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": 80,
        "temperature": 0,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8},
                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"], "additionalProperties": false}}}],
        "tool_choice": "required",
        "parallel_tool_calls": false,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body.to_string()
}

async fn post(st: &Arc<AppState>, body: String) -> (StatusCode, Vec<u8>) {
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = app(st.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, bytes.to_vec())
}

/// The call's name and arguments, checked against the tool's schema by hand.
fn check_call(call: &Value) -> (String, String) {
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function");
    let name = call["function"]["name"].as_str().unwrap().to_string();
    let arguments = call["function"]["arguments"].as_str().unwrap().to_string();
    assert_eq!(name, "get_weather");
    let args: Value = serde_json::from_str(&arguments).unwrap();
    assert!(
        args["city"].as_str().unwrap().chars().count() <= 8,
        "{args}"
    );
    assert!((1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");
    assert_eq!(args.as_object().unwrap().len(), 2, "{args}");
    (name, arguments)
}

#[tokio::test]
async fn required_calls_are_valid_and_stream_as_deltas() {
    let st = state();
    let (s, raw) = post(&st, body(json!({}))).await;
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(s, StatusCode::OK, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], Value::Null, "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    let whole = check_call(&calls[0]);

    let (s, raw) = post(&st, body(json!({"stream": true}))).await;
    assert_eq!(s, StatusCode::OK);
    let text = String::from_utf8_lossy(&raw).to_string();
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let mut call = json!({"function": {"name": "", "arguments": ""}});
    let mut finish = Value::Null;
    let mut pieces = 0;
    for c in &chunks {
        let ch = &c["choices"][0];
        assert!(
            ch["delta"]["content"].as_str().unwrap_or("").is_empty(),
            "{c}"
        );
        for d in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
            assert_eq!(d["index"], 0, "{c}");
            // The naming delta comes first, with empty arguments; then argument pieces.
            if d["id"].is_null() {
                assert!(
                    call["id"].is_string(),
                    "arguments before the call's id: {c}"
                );
                pieces += 1;
            } else {
                assert_eq!(d["function"]["arguments"], "", "{c}");
            }
            for k in ["id", "type"] {
                if !d[k].is_null() {
                    call[k] = d[k].clone();
                }
            }
            for k in ["name", "arguments"] {
                let piece = d["function"][k].as_str().unwrap_or("");
                let so_far = call["function"][k].as_str().unwrap().to_string();
                call["function"][k] = json!(so_far + piece);
            }
        }
        if !ch["finish_reason"].is_null() {
            finish = ch["finish_reason"].clone();
        }
    }
    assert_eq!(finish, "tool_calls", "{text}");
    assert!(pieces > 1, "arguments in {pieces} piece(s): {text}");
    assert_eq!(check_call(&call), whole);
}

#[tokio::test]
async fn a_history_with_calls_and_results_renders() {
    let st = state();
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."},
    ]);
    let (s, raw) = post(
        &st,
        body(json!({"messages": history, "tool_choice": "auto", "max_tokens": 8})),
    )
    .await;
    let v: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(s, StatusCode::OK, "{v}");
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(["stop", "length", "tool_calls"].contains(&finish), "{v}");
}
