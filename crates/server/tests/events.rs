//! The page and its live feed, in process on the strata-tiny-moe model: the event stream's
//! format, routing counts equal to the routing the model reports, and the cost of counting.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode, header};
use futures_util::StreamExt;
use serde_json::{Value, json};
use strata_model::{
    ForwardObserver, LogitsWanted, Model, Precision, Routing, RoutingTap, SeqInput, SeqSpan,
};
use strata_runtime::engine::Engine;
use strata_runtime::scheduler::SchedulerConfig;
use strata_server::events::RoutingCounts;
use strata_server::{AppState, app};
use tower::ServiceExt;

const MODEL: &str = "strata-tiny-moe";

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe")
}

/// An engine of its own per test: the routing tap is the model's, one per server.
fn engine() -> Arc<Engine> {
    Arc::new(Engine::load(&model_dir(), Precision::Fast).unwrap())
}

/// The CPU model alone, for the passes that compare the tap with `forward_observed`.
fn model() -> Model {
    Model::load(&model_dir(), Precision::Fast).unwrap()
}

fn state() -> Arc<AppState> {
    let config = SchedulerConfig {
        max_batch: 4,
        max_queue: 8,
        step_tokens: 64,
        ctx_size: 256,
        prefix_cache_bytes: 0,
    };
    Arc::new(AppState::new(engine(), config, MODEL.into()))
}

/// One server-sent event: its `event:` name, `data:` and `retry:` fields.
#[derive(Debug, Default)]
struct Sse {
    event: String,
    data: String,
    retry: Option<u64>,
}

/// Reads events from an SSE body until `want` of them arrived (keep-alive comments
/// skipped), failing after `timeout`.
async fn read_events(
    body: &mut (impl futures_util::Stream<Item = Result<axum::body::Bytes, axum::Error>> + Unpin),
    buf: &mut String,
    want: usize,
    timeout: Duration,
) -> Vec<Sse> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while out.len() < want {
        while let Some(cut) = buf.find("\n\n") {
            let block: String = buf.drain(..cut + 2).collect();
            let mut ev = Sse::default();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    ev.event = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    ev.data.push_str(v);
                } else if let Some(v) = line.strip_prefix("retry: ") {
                    ev.retry = Some(v.parse().unwrap());
                } else {
                    assert!(
                        line.starts_with(':') || line.is_empty(),
                        "bad line {line:?}"
                    );
                }
            }
            if !ev.event.is_empty() {
                out.push(ev);
            }
        }
        if out.len() >= want {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, body.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {want} events in {timeout:?}", out.len()))
            .expect("the event stream ended")
            .unwrap();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_its_assets_are_served() {
    let st = state();
    for (path, kind, needle) in [
        ("/", "text/html", "/assets/app.js"),
        ("/assets/app.js", "text/javascript", "/v1/strata/events"),
        ("/assets/style.css", "text/css", "#heat-tip"),
    ] {
        let resp = app(st.clone())
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let ct = resp.headers()[header::CONTENT_TYPE].to_str().unwrap();
        assert!(ct.starts_with(kind), "{path}: {ct}");
        let body = to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains(needle), "{path} lacks {needle}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_say_hello_then_tick_with_the_heat_of_a_request() {
    let st = state();
    let resp = app(st.clone())
        .oneshot(
            Request::get("/v1/strata/events")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut body = resp.into_body().into_data_stream();
    let mut buf = String::new();
    let hello = read_events(&mut body, &mut buf, 1, Duration::from_secs(5)).await;
    assert_eq!(hello[0].event, "hello");
    assert_eq!(hello[0].retry, Some(1000));
    let hello: Value = serde_json::from_str(&hello[0].data).unwrap();
    assert_eq!(hello["model"], MODEL);
    assert_eq!(hello["layers"], json!([0, 1, 2, 3, 4, 5]));
    assert_eq!(hello["experts"], 32);
    assert_eq!(hello["top_k"], 4);
    assert!(hello["history"].is_array());

    // A request of 24 tokens: its routing shows in the ticks' heat.
    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": 24,
        "ignore_eos": true,
    });
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(chat.to_string()))
        .unwrap();
    let resp = app(st.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let done: Value =
        serde_json::from_slice(&to_bytes(resp.into_body(), usize::MAX).await.unwrap()).unwrap();
    let usage = &done["usage"];
    // Every token but the last generated one went through the model.
    let forwarded = usage["prompt_tokens"].as_u64().unwrap() + 23;

    let mut best = 0;
    for _ in 0..12 {
        let tick = read_events(&mut body, &mut buf, 1, Duration::from_secs(5)).await;
        assert_eq!(tick[0].event, "tick");
        let f: Value = serde_json::from_str(&tick[0].data).unwrap();
        let heat = f["heat"].as_array().unwrap();
        let tokens = f["heat_tokens"].as_array().unwrap();
        assert_eq!(heat.len(), 6);
        for (row, t) in heat.iter().zip(tokens) {
            let row: Vec<u64> = serde_json::from_value(row.clone()).unwrap();
            assert_eq!(row.len(), 32);
            assert_eq!(row.iter().sum::<u64>(), 4 * t.as_u64().unwrap());
        }
        assert!(f["sample"]["t"].as_u64().unwrap() > 0);
        assert!(f["hybrid"].is_null());
        best = best.max(tokens[0].as_u64().unwrap());
        if best == forwarded {
            assert_eq!(f["generated"], 24);
            assert_eq!(f["requests"], 1);
            break;
        }
    }
    assert_eq!(
        best, forwarded,
        "the heat of the last 5 s counts every token run"
    );

    // Closing the feed (the server's shutdown) ends the stream.
    st.live.close();
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(chunk) = body.next().await {
            chunk.unwrap();
        }
    });
    end.await.expect("the event stream did not end after close");
}

/// Records what `forward_observed` reports, for comparison with the tap's counts.
struct Load(Vec<Vec<u64>>);

impl ForwardObserver for Load {
    fn on_routing(&mut self, layer: usize, _: &[SeqSpan], routing: &Routing, _: &[f32]) {
        for &e in &routing.ids {
            self.0[layer][e as usize] += 1;
        }
    }
}

fn run_batch(model: &Model, observer: Option<&mut Load>) {
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5], &[7, 8], &[100, 200, 300, 400]];
    let mut caches: Vec<_> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut seqs: Vec<SeqInput> = prompts
        .iter()
        .zip(caches.iter_mut())
        .map(|(p, cache)| SeqInput {
            tokens: p,
            cache,
            logits: LogitsWanted::Last,
        })
        .collect();
    match observer {
        Some(o) => model.forward_observed(&mut seqs, o).unwrap(),
        None => model.forward(&mut seqs).unwrap(),
    };
}

#[test]
fn the_tap_counts_the_routing_the_model_reports() {
    let model = model();
    let counts = Arc::new(RoutingCounts::new(&model.config));
    model.set_routing_tap(Some(counts.clone() as Arc<dyn RoutingTap>));
    run_batch(&model, None);
    run_batch(&model, None);
    model.set_routing_tap(None);
    run_batch(&model, None);
    let mut load = Load(vec![vec![0; 32]; 6]);
    run_batch(&model, Some(&mut load));
    let want: Vec<u64> = load.0.iter().flatten().map(|n| 2 * n).collect();
    assert_eq!(counts.snapshot(), want);
    assert_eq!(want.iter().sum::<u64>(), 2 * 6 * 11 * 4);
}

/// Decode steps with and without the tap, alternating; prints the ratio. The tiny model is
/// the worst case: the least work per routed token.
#[test]
#[ignore = "a measurement: cargo test -p strata-server --test events -- --ignored --nocapture"]
fn tap_overhead_on_decode() {
    let model = model();
    let counts = Arc::new(RoutingCounts::new(&model.config));
    let steps = 64;
    let mut time = [Duration::ZERO; 2];
    let rounds = 20;
    for round in 0..rounds {
        // Tapped first in even rounds, second in odd ones.
        for tapped in [round % 2 == 0, round % 2 != 0] {
            let tap = tapped.then(|| counts.clone() as Arc<dyn RoutingTap>);
            model.set_routing_tap(tap);
            let mut cache = model.new_cache();
            let started = Instant::now();
            for t in 0..steps {
                let token = [(t * 37 % 8000) as u32 + 1];
                let mut seqs = [SeqInput {
                    tokens: &token,
                    cache: &mut cache,
                    logits: LogitsWanted::Last,
                }];
                model.forward(&mut seqs).unwrap();
            }
            time[usize::from(!tapped)] += started.elapsed();
        }
    }
    // The tap alone, without the noise of the forward pass: one decode token's routing.
    let one = Routing {
        top_k: 4,
        ids: vec![3, 17, 9, 30],
        weights: vec![0.25; 4],
        candidates: None,
    };
    let calls = 1_000_000;
    let started = Instant::now();
    for i in 0..calls {
        counts.on_routing(i % 6, std::hint::black_box(&one));
    }
    println!(
        "tap: {:.1} ns per MoE layer of one decode token",
        started.elapsed().as_secs_f64() * 1e9 / calls as f64
    );
    let per = |d: Duration| d.as_secs_f64() * 1e6 / (rounds * steps) as f64;
    println!(
        "decode step: {:.1} us with the tap, {:.1} us without, ratio {:.4}",
        per(time[0]),
        per(time[1]),
        time[0].as_secs_f64() / time[1].as_secs_f64()
    );
}
