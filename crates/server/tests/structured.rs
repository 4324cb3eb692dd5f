//! Structured outputs through the router and the offline batch runner, on the
//! strata-tiny-moe model: schema-valid JSON streamed and not, per-line `response_format` in
//! a batch, errors that name the field, and disconnects under a grammar.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use futures_util::StreamExt;
use serde_json::{Value, json};
use strata_model::Precision;
use strata_runtime::engine::Engine;
use strata_runtime::scheduler::SchedulerConfig;
use strata_server::offline::Offline;
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
        ctx_size: 256,
        prefix_cache_bytes: 0,
    };
    Arc::new(AppState::new(engine.clone(), config, MODEL.into()))
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    })
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "A person as JSON"}],
        "max_tokens": 80,
        "temperature": 0,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "person", "schema": schema(), "strict": true}},
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

async fn call(st: &Arc<AppState>, body: &Value) -> (StatusCode, Vec<u8>) {
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app(st.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    (
        status,
        to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec(),
    )
}

/// The person the schema describes, or why `text` is not one.
fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{text}"));
    assert!(
        o["name"].as_str().is_some_and(|n| n.chars().count() <= 10),
        "{text}"
    );
    assert!(o["age"].as_u64().is_some_and(|a| a <= 99), "{text}");
    assert!(
        o.keys()
            .all(|k| ["name", "age", "pets"].contains(&k.as_str())),
        "{text}"
    );
}

#[tokio::test]
async fn json_schema_streamed_and_not() {
    let st = state();
    let (status, body) = call(&st, &chat(json!({"n": 2, "seed": 3, "temperature": 1.0}))).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).unwrap();
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "stop", "{c}");
        check_person(c["message"]["content"].as_str().unwrap());
    }
    let (_, body) = call(&st, &chat(json!({}))).await;
    let full: Value = serde_json::from_slice(&body).unwrap();
    let text = full["choices"][0]["message"]["content"].as_str().unwrap();
    check_person(text);
    let (status, body) = call(&st, &chat(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK);
    let streamed: String = String::from_utf8_lossy(&body)
        .split("\n\n")
        .filter_map(|ev| ev.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(streamed, text);
}

#[tokio::test]
async fn unenforceable_and_malformed_formats_name_the_field() {
    let st = state();
    let mut bad = schema();
    bad["uniqueItems"] = json!(true);
    let body = chat(json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "p", "schema": bad}}}));
    let (status, body) = call(&st, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let e: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        e["error"]["param"], "response_format.json_schema.schema",
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("uniqueItems"),
        "{e}"
    );
    let body =
        chat(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}));
    let (status, body) = call(&st, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let e: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        e["error"]["param"], "response_format.json_schema.name",
        "{e}"
    );
}

#[tokio::test]
async fn disconnects_under_a_grammar_free_the_batch() {
    let st = state();
    for _ in 0..4 {
        let req = Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Body::from(
                chat(json!({"stream": true, "max_tokens": 200})).to_string(),
            ))
            .unwrap();
        let resp = app(st.clone()).oneshot(req).await.unwrap();
        let mut body = resp.into_body().into_data_stream();
        // Read the first chunk, then hang up.
        let _ = body.next().await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while (st.scheduler.active() > 0 || st.scheduler.queued() > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!((st.scheduler.active(), st.scheduler.queued()), (0, 0));
    let (status, body) = call(&st, &chat(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
}

#[test]
fn batch_lines_carry_their_own_response_format() {
    let offline = Offline::new(state()).unwrap();
    let line = |id: &str, body: Value| {
        json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions", "body": body})
            .to_string()
    };
    let mut plain = chat(json!({"max_tokens": 8}));
    plain.as_object_mut().unwrap().remove("response_format");
    let lines = vec![
        (0, line("schema", chat(json!({})))),
        (
            1,
            line(
                "object",
                chat(json!({"response_format": {"type": "json_object"}})),
            ),
        ),
        (2, line("plain", plain)),
        (
            3,
            line("bad", chat(json!({"response_format": {"type": "xml"}}))),
        ),
    ];
    let mut results = vec![None; lines.len()];
    offline.run(lines, |i, r| results[i] = Some(r));
    let body = |i: usize| -> Value {
        let r = results[i].as_ref().unwrap();
        serde_json::from_str::<Value>(&r.line).unwrap()["response"]["body"].clone()
    };
    check_person(
        body(0)["choices"][0]["message"]["content"]
            .as_str()
            .unwrap(),
    );
    let object = body(1)["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(object.starts_with('{'), "{object}");
    assert!(results[2].as_ref().unwrap().ok);
    assert!(!results[3].as_ref().unwrap().ok);
    assert_eq!(body(3)["error"]["param"], "response_format.type");
}
