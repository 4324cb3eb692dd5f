//! In-process tests of every endpoint through the router, on the strata-tiny-moe model.

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
use strata_server::{AppState, app};
use tower::ServiceExt;

const MODEL: &str = "strata-tiny-moe";
const CTX: usize = 256;

fn engine() -> Arc<Engine> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
            Arc::new(Engine::load(&dir, Precision::Fast).unwrap())
        })
        .clone()
}

fn state() -> Arc<AppState> {
    state_with_prefix_cache(0)
}

fn state_with_prefix_cache(prefix_cache_bytes: usize) -> Arc<AppState> {
    let config = SchedulerConfig {
        max_batch: 4,
        max_queue: 8,
        step_tokens: 64,
        ctx_size: CTX,
        prefix_cache_bytes,
    };
    Arc::new(AppState::new(engine(), config, MODEL.into()))
}

fn post(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

async fn call(st: &Arc<AppState>, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = app(st.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let body = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, body.to_vec())
}

async fn call_json(st: &Arc<AppState>, req: Request<Body>) -> (StatusCode, Value) {
    let (status, body) = call(st, req).await;
    let v = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
    (status, v)
}

/// The `data:` payloads of a server-sent event stream.
fn sse_data(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(str::to_string)
        .collect()
}

fn chat_body(extra: Value) -> String {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": 12,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body.to_string()
}

async fn wait_idle(st: &AppState) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while (st.scheduler.active() > 0 || st.scheduler.queued() > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!((st.scheduler.active(), st.scheduler.queued()), (0, 0));
}

#[tokio::test]
async fn health_models_and_metrics() {
    let st = state();
    let (s, v) = call_json(&st, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!((s, v), (StatusCode::OK, json!({"status": "ok"})));
    let (s, v) = call_json(&st, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["object"], "model");

    let (s, _) = call_json(&st, post("/v1/chat/completions", chat_body(json!({})))).await;
    assert_eq!(s, StatusCode::OK);
    let (s, body) = call(&st, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    for line in [
        "strata_requests_total{endpoint=\"chat_completions\"} 1",
        "strata_generation_tokens_total ",
        "strata_time_to_first_token_seconds_count 1",
        "strata_inter_token_latency_seconds_bucket{le=\"+Inf\"}",
        "strata_queue_depth 0",
        "strata_active_sequences 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

#[tokio::test]
async fn a_shared_system_prompt_reports_cached_tokens() {
    let st = state_with_prefix_cache(16 << 20);
    let system = "You are a careful assistant. ".repeat(12);
    let body = |user: &str, extra: Value| {
        let mut b: Value = serde_json::from_str(&chat_body(extra)).unwrap();
        b["messages"] = json!([
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]);
        b.to_string()
    };
    let usage = |v: &Value| {
        (
            v["usage"]["prompt_tokens"].as_u64().unwrap(),
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        )
    };
    let (_, first) = call_json(&st, post("/v1/chat/completions", body("Hi.", json!({})))).await;
    let (prompt, cached) = usage(&first);
    assert_eq!(cached, 0, "{first}");
    // The same request again: all but the last token from the cache, the same answer.
    let (_, again) = call_json(&st, post("/v1/chat/completions", body("Hi.", json!({})))).await;
    assert_eq!(usage(&again), (prompt, prompt - 1));
    assert_eq!(
        again["choices"][0]["message"],
        first["choices"][0]["message"]
    );
    // Another question after the same system prompt, streamed: the usage chunk says so.
    let req = body(
        "Bye.",
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let (_, raw) = call(&st, post("/v1/chat/completions", req)).await;
    let data = sse_data(&raw);
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    let (_, cached) = usage(&last);
    assert!(cached >= 64 && cached < prompt, "{last}");
    let (_, body) = call(&st, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let text = String::from_utf8(body).unwrap();
    let hits = format!(
        "strata_prefix_cache_hit_tokens_total {}",
        prompt - 1 + cached
    );
    assert!(text.contains(&hits), "missing {hits:?} in\n{text}");
    let budget = format!("strata_prefix_cache_budget_bytes {}\n", 16 << 20);
    // Every request has ended: no sequence holds KV cache.
    for line in [budget.as_str(), "strata_kv_cache_bytes 0\n"] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

/// A stand-in for the hybrid executor's counters.
#[derive(Debug)]
struct Extra;

impl strata_server::metrics::MetricsSource for Extra {
    fn render(&self, out: &mut String) {
        out.push_str("# HELP x_total X.\n# TYPE x_total counter\nx_total{device=\"gpu\"} 3\n");
    }
}

#[tokio::test]
async fn metrics_carry_an_extra_source() {
    let mut st = AppState::new(
        engine(),
        SchedulerConfig {
            max_batch: 1,
            max_queue: 1,
            step_tokens: 8,
            ctx_size: CTX,
            prefix_cache_bytes: 0,
        },
        MODEL.into(),
    );
    st.extra_metrics = Some(Arc::new(Extra));
    let (s, body) = call(
        &Arc::new(st),
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains("strata_queue_depth 0\n"), "{text}");
    assert!(text.ends_with("x_total{device=\"gpu\"} 3\n"), "{text}");
}

#[tokio::test]
async fn chat_streamed_equals_non_streamed() {
    let st = state();
    let (s, v) = call_json(&st, post("/v1/chat/completions", chat_body(json!({})))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let usage = &v["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion), "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + completion
    );
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(finish == "length", completion == 12, "{v}");

    let body = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let (s, raw) = call(&st, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK);
    let data = sse_data(&raw);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut streamed = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(t);
        }
    }
    assert_eq!(streamed, content);
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], finish);
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(&chunks[n - 1]["usage"], usage);
}

#[tokio::test]
async fn completions_with_logprobs_n_and_stop() {
    let st = state();
    let body = json!({
        "model": MODEL, "prompt": "Once upon a time", "max_tokens": 10,
        "temperature": 0, "logprobs": 3,
    });
    let (s, v) = call_json(&st, post("/v1/completions", body.to_string())).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "text_completion");
    let c = &v["choices"][0];
    let text = c["text"].as_str().unwrap().to_string();
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        // Greedy: the chosen token is the most likely one.
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(
            (best - chosen).abs() < 1e-4,
            "token {i}: {chosen} vs {best}"
        );
    }

    // A stop string taken from the greedy output cuts the text before it.
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.len() >= 2 {
        let stop = words[1];
        let body = json!({
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 10,
            "temperature": 0, "stop": [stop],
        });
        let (s, v) = call_json(&st, post("/v1/completions", body.to_string())).await;
        assert_eq!(s, StatusCode::OK);
        let cut = v["choices"][0]["text"].as_str().unwrap();
        assert_eq!(cut, &text[..text.find(stop).unwrap()]);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }

    // n = 3 with a seed: three choices, reproducible.
    let body = json!({
        "model": MODEL, "prompt": ["Hello", "The sea"], "max_tokens": 6, "n": 3, "seed": 7,
        "temperature": 1.0,
    });
    let (s, a) = call_json(&st, post("/v1/completions", body.to_string())).await;
    assert_eq!(s, StatusCode::OK, "{a}");
    assert_eq!(a["choices"].as_array().unwrap().len(), 6);
    let (_, b) = call_json(&st, post("/v1/completions", body.to_string())).await;
    for i in 0..6 {
        assert_eq!(a["choices"][i]["index"], i);
        assert_eq!(a["choices"][i]["text"], b["choices"][i]["text"]);
    }
    wait_idle(&st).await;
}

/// Sends a request and checks the error status, type, param and code.
async fn check_error(
    st: &Arc<AppState>,
    req: Request<Body>,
    status: StatusCode,
    param: Option<&str>,
    code: Option<&str>,
) {
    let (s, v) = call_json(st, req).await;
    assert_eq!(s, status, "{v}");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert_eq!(e["param"].as_str(), param, "{v}");
    assert_eq!(e["code"].as_str(), code, "{v}");
}

#[tokio::test]
async fn errors_have_the_openai_shape() {
    let st = state();
    let bad = StatusCode::BAD_REQUEST;
    let chat = |b: String| post("/v1/chat/completions", b);
    check_error(
        &st,
        chat("{not json".into()),
        bad,
        None,
        Some("invalid_json"),
    )
    .await;
    check_error(&st, chat("[]".into()), bad, None, None).await;
    let wrong = chat_body(json!({"temperature": "hot"}));
    check_error(&st, chat(wrong), bad, Some("temperature"), None).await;
    let neg = chat_body(json!({"temperature": -1}));
    check_error(&st, chat(neg), bad, Some("temperature"), None).await;
    let unknown = chat_body(json!({"bogus": 1}));
    check_error(&st, chat(unknown), bad, Some("bogus"), None).await;
    let model = chat_body(json!({"model": "gpt-4"}));
    let nf = StatusCode::NOT_FOUND;
    check_error(&st, chat(model), nf, Some("model"), Some("model_not_found")).await;
    // `strata generate -n 0` is refused alike (crates/cli/tests/newcomer.rs).
    let zero = chat_body(json!({"max_tokens": 0}));
    check_error(&st, chat(zero), bad, Some("max_tokens"), None).await;
    let huge = chat_body(json!({"max_tokens": 1_000_000}));
    let ctx = Some("context_length_exceeded");
    check_error(&st, chat(huge), bad, Some("max_tokens"), ctx).await;
    let long = chat_body(json!({"messages": [{"role": "user", "content": "word ".repeat(400)}]}));
    check_error(&st, chat(long), bad, Some("messages"), ctx).await;
    let n = chat_body(json!({"n": 100}));
    check_error(&st, chat(n), bad, Some("n"), None).await;
    let role = chat_body(json!({"messages": [{"role": "wizard", "content": "x"}]}));
    check_error(&st, chat(role), bad, Some("messages[0].role"), None).await;
    let big = vec![b' '; strata_server::DEFAULT_MAX_BODY + 1];
    let too_large = StatusCode::PAYLOAD_TOO_LARGE;
    check_error(
        &st,
        chat(String::from_utf8(big).unwrap()),
        too_large,
        None,
        Some("body_too_large"),
    )
    .await;
    let tok = json!({"model": MODEL, "prompt": [1, 2, 99_999_999]}).to_string();
    check_error(&st, post("/v1/completions", tok), bad, Some("prompt"), None).await;
    let get = Request::get("/v1/nothing").body(Body::empty()).unwrap();
    check_error(&st, get, nf, None, Some("not_found")).await;
    // The server still serves.
    let (s, _) = call_json(&st, post("/v1/chat/completions", chat_body(json!({})))).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn disconnected_clients_are_cancelled() {
    let st = state();
    // The request run to the end generates `full` tokens...
    let mut body = json!({
        "model": MODEL, "prompt": "Once upon a time", "max_tokens": 200,
        "temperature": 1.0, "seed": 1, "ignore_eos": true,
    });
    let (s, v) = call_json(&st, post("/v1/completions", body.to_string())).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let full = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(full, 200);
    // ...streamed: read the first event, then drop the body as a closed socket would.
    body["stream"] = json!(true);
    let before = st.scheduler.generated_tokens();
    let resp = app(st.clone())
        .oneshot(post("/v1/completions", body.to_string()))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut frames = resp.into_body().into_data_stream();
    let first = frames.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    assert!(st.scheduler.active() + st.scheduler.queued() <= 1);
    drop(frames);
    wait_idle(&st).await;
    let cancelled = st.scheduler.generated_tokens() - before;
    assert!(
        cancelled < full / 2,
        "{cancelled} of {full} tokens generated after disconnect"
    );

    // Not streaming: the handler's future is dropped mid-generation.
    body["stream"] = json!(false);
    let before = st.scheduler.generated_tokens();
    let fut = app(st.clone()).oneshot(post("/v1/completions", body.to_string()));
    let timed = tokio::time::timeout(Duration::from_millis(30), fut).await;
    assert!(timed.is_err(), "the request finished in 30 ms");
    wait_idle(&st).await;
    let cancelled = st.scheduler.generated_tokens() - before;
    assert!(
        cancelled < full / 2,
        "{cancelled} of {full} tokens generated after disconnect"
    );
}

#[tokio::test]
async fn full_queue_answers_429() {
    let config = SchedulerConfig {
        max_batch: 1,
        max_queue: 1,
        step_tokens: 64,
        ctx_size: CTX,
        prefix_cache_bytes: 0,
    };
    let st = Arc::new(AppState::new(engine(), config, MODEL.into()));
    let body = json!({
        "model": MODEL, "prompt": "Once upon a time", "max_tokens": 200,
        "temperature": 1.0, "seed": 3, "stream": true,
    })
    .to_string();
    // Two streams hold the batch and the queue.
    let mut held = Vec::new();
    for waiting in [0, 1] {
        let resp = app(st.clone())
            .oneshot(post("/v1/completions", body.clone()))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        held.push(resp);
        // Let the scheduler admit the first before the second queues.
        let deadline = Instant::now() + Duration::from_secs(10);
        while (st.scheduler.active(), st.scheduler.queued()) != (1, waiting)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let req = post("/v1/completions", body.clone());
    let (s, v) = call_json(&st, req).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    drop(held);
    wait_idle(&st).await;
}
