//! Structured outputs on the shipped model: every constrained generation is JSON valid for
//! its schema, in the batched engine and under the continuous-batching scheduler with
//! cancellation, and schemas the grammar cannot enforce are refused by name.

use std::path::Path;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use strata_model::Precision;
use strata_runtime::engine::{Engine, FinishReason};
use strata_runtime::grammar::{GrammarError, ResponseFormat};
use strata_runtime::sampling::SamplingParams;
use strata_runtime::scheduler::{Event, GenRequest, Scheduler, SchedulerConfig, generate_batch};

fn engine() -> Arc<Engine> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
            Arc::new(Engine::load(&dir, Precision::Fast).unwrap())
        })
        .clone()
}

/// Schemas of varied shape, each bounded so that a small token budget completes it.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
               "required": ["name"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "ok": {"type": "boolean"}},
               "required": ["age", "ok"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                   "color": {"enum": ["red", "green", "blue"]},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                            "minItems": 1, "maxItems": 3}},
               "required": ["color", "tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                   "point": {"type": "object", "properties": {
                       "x": {"type": "integer", "minimum": -10, "maximum": 10},
                       "y": {"type": "integer", "minimum": -10, "maximum": 10}},
                     "required": ["x", "y"], "additionalProperties": false},
                   "label": {"type": "string", "maxLength": 8}},
               "required": ["point"], "additionalProperties": false}),
        json!({"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 2, "maxItems": 4}),
    ]
}

/// A check of the schema subset above: types, required and extra properties, enums,
/// bounds and lengths.
fn valid(v: &Value, s: &Value) -> bool {
    if let Some(options) = s.get("enum").and_then(Value::as_array) {
        return options.contains(v);
    }
    let within = |x: f64| {
        s.get("minimum")
            .and_then(Value::as_f64)
            .is_none_or(|m| x >= m)
            && s.get("maximum")
                .and_then(Value::as_f64)
                .is_none_or(|m| x <= m)
    };
    let count_ok = |n: usize, min: &str, max: &str| {
        s.get(min)
            .and_then(Value::as_u64)
            .is_none_or(|m| n as u64 >= m)
            && s.get(max)
                .and_then(Value::as_u64)
                .is_none_or(|m| n as u64 <= m)
    };
    match s["type"].as_str() {
        Some("object") => {
            let Some(o) = v.as_object() else { return false };
            let props = s["properties"].as_object().cloned().unwrap_or_default();
            let required = s["required"].as_array().cloned().unwrap_or_default();
            required
                .iter()
                .all(|k| o.contains_key(k.as_str().unwrap_or("")))
                && o.iter()
                    .all(|(k, v)| props.get(k).is_some_and(|p| valid(v, p)))
        }
        Some("array") => v.as_array().is_some_and(|a| {
            count_ok(a.len(), "minItems", "maxItems") && a.iter().all(|x| valid(x, &s["items"]))
        }),
        Some("string") => v
            .as_str()
            .is_some_and(|t| count_ok(t.chars().count(), "minLength", "maxLength")),
        Some("integer") => v.as_i64().is_some_and(|x| within(x as f64)),
        Some("number") => v.as_f64().is_some_and(within),
        Some("boolean") => v.is_boolean(),
        _ => false,
    }
}

fn sampling(seed: Option<u64>) -> SamplingParams {
    match seed {
        Some(seed) => SamplingParams {
            seed: Some(seed),
            ..SamplingParams::default()
        },
        None => SamplingParams::greedy(),
    }
}

#[test]
fn constrained_generations_are_valid_for_their_schema() {
    let engine = engine();
    let prompt = engine.text_prompt("Here is the record as JSON:").unwrap();
    let mut requests = Vec::new();
    let mut formats = Vec::new();
    for (i, schema) in schemas().into_iter().enumerate() {
        for seed in [None, Some(i as u64)] {
            let format = ResponseFormat::JsonSchema(schema.clone());
            requests.push(GenRequest {
                grammar: Some(engine.compile_format(&format).unwrap()),
                ..GenRequest::new(prompt.clone(), 96, sampling(seed))
            });
            formats.push(schema.clone());
        }
    }
    requests.push(GenRequest {
        grammar: Some(engine.compile_format(&ResponseFormat::JsonObject).unwrap()),
        ..requests[0].clone()
    });
    formats.push(json!({"type": "object", "additionalProperties": true}));
    let (outputs, _) = generate_batch(&engine, &requests, |_, _| {}).unwrap();
    for (out, schema) in outputs.iter().zip(&formats) {
        assert_eq!(out.finish, FinishReason::Stop, "{schema}: {:?}", out.text);
        let v: Value = serde_json::from_str(&out.text)
            .unwrap_or_else(|e| panic!("{schema}: {e}: {:?}", out.text));
        if schema["additionalProperties"] == true {
            assert!(v.is_object(), "{:?}", out.text);
        } else {
            assert!(valid(&v, schema), "{schema}: {}", out.text);
        }
        let stats = out.grammar.expect("grammar stats");
        assert!(stats.tokens >= out.tokens.len(), "{stats:?}");
    }
}

#[test]
fn schedule_constrained_sequences_with_cancellation() {
    let engine = engine();
    let s = Scheduler::start(
        engine.clone(),
        SchedulerConfig {
            max_batch: 4,
            max_queue: 16,
            step_tokens: 32,
            ctx_size: 256,
            prefix_cache_bytes: 0,
        },
    );
    let prompt = engine.text_prompt("JSON:").unwrap();
    let schemas = schemas();
    let mut receivers = Vec::new();
    for i in 0..8 {
        let schema = &schemas[i % schemas.len()];
        let format = ResponseFormat::JsonSchema(schema.clone());
        let req = GenRequest {
            grammar: Some(engine.compile_format(&format).unwrap()),
            ..GenRequest::new(prompt.clone(), 96, sampling(Some(i as u64)))
        };
        let (tx, rx) = mpsc::channel();
        s.submit(req, Box::new(move |e| tx.send(e).is_ok()))
            .unwrap();
        receivers.push((i, schema.clone(), rx));
    }
    for (i, schema, rx) in receivers {
        // Every third client leaves after its first token: its sequence and its grammar
        // thread go away while the others run.
        if i % 3 == 0 {
            let _ = rx.recv_timeout(Duration::from_secs(60)).unwrap();
            continue;
        }
        let mut text = String::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
                Event::Token { text: t, .. } => text.push_str(&t),
                Event::Done {
                    finish, text: t, ..
                } => {
                    text.push_str(&t);
                    assert_eq!(finish, FinishReason::Stop, "{text:?}");
                    break;
                }
                Event::Failed(e) => panic!("request {i}: {e}"),
            }
        }
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(valid(&v, &schema), "{schema}: {text}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while (s.active() > 0 || s.queued() > 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!((s.active(), s.queued()), (0, 0));
}

#[test]
fn unsupported_schemas_are_refused_by_name() {
    let engine = engine();
    let check = |schema: Value, names: &str| match engine
        .compile_format(&ResponseFormat::JsonSchema(schema.clone()))
    {
        Err(GrammarError::Schema(m)) => assert!(m.contains(names), "{schema}: {m}"),
        other => panic!("{schema}: {other:?}"),
    };
    check(json!({"type": "object", "not": {"required": ["a"]}}), "not");
    check(json!({"type": "string", "contains": {}}), "contains");
    check(json!({"$ref": "#/$defs/missing"}), "missing");
    check(json!(false), "schema");
    check(json!([1, 2]), "schema");
}
