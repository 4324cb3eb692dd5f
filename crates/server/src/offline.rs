//! Offline batches in the OpenAI Batch API format, run through the same app in-process.
//!
//! Each input line `{"custom_id", "method", "url", "body"}` becomes a request to [`app`]'s
//! router without a socket, so a batch line gets exactly the limits, defaults and errors
//! that the HTTP server gives; each output line is `{"id", "custom_id", "response":
//! {"status_code", "request_id", "body"}, "error"}`.
//!
//! A key design decision made here is to keep up to the scheduler's batch plus queue in
//! flight and let the scheduler do the batching: the offline mode has no batching logic of
//! its own to drift from the server's.

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::http::Request;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::{AppState, ServerError, app};

/// What one input line produced.
#[derive(Debug, Clone)]
pub struct LineResult {
    /// The output line (JSON, no newline).
    pub line: String,
    /// Whether the request succeeded (HTTP 200).
    pub ok: bool,
    /// Prompt tokens (from the response's usage).
    pub prompt_tokens: u64,
    /// Generated tokens (from the response's usage).
    pub completion_tokens: u64,
}

/// The `custom_id` of a Batch API line (input or output), if it parses.
pub fn custom_id(line: &str) -> Option<String> {
    let v: Value = serde_json::from_str(line).ok()?;
    v.get("custom_id")?.as_str().map(str::to_string)
}

/// Runs batch lines through an in-process server.
#[derive(Debug)]
pub struct Offline {
    rt: tokio::runtime::Runtime,
    state: Arc<AppState>,
}

impl Offline {
    /// A runner over `state` (its scheduler does the batching).
    pub fn new(state: Arc<AppState>) -> Result<Offline, ServerError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|source| ServerError::Io {
                addr: "offline".into(),
                source,
            })?;
        Ok(Offline { rt, state })
    }

    /// Runs every `(index, line)`, keeping the scheduler's batch plus queue busy, and calls
    /// `done(index, result)` as each finishes (in completion order).
    pub fn run(&self, lines: Vec<(usize, String)>, mut done: impl FnMut(usize, LineResult)) {
        let cfg = self.state.scheduler.config();
        let in_flight = (cfg.max_batch + cfg.max_queue / 2).max(1);
        let state = Arc::clone(&self.state);
        self.rt.block_on(async move {
            let sem = Arc::new(tokio::sync::Semaphore::new(in_flight));
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let total = lines.len();
            let feeder = {
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    for (index, line) in lines {
                        let Ok(permit) = Arc::clone(&sem).acquire_owned().await else {
                            return;
                        };
                        let state = Arc::clone(&state);
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            let result = run_line(&state, index, &line).await;
                            drop(permit);
                            let _ = tx.send((index, result));
                        });
                    }
                })
            };
            for _ in 0..total {
                let Some((index, result)) = rx.recv().await else {
                    break;
                };
                done(index, result);
            }
            let _ = feeder.await;
        });
    }
}

/// Runs one input line.
async fn run_line(state: &Arc<AppState>, index: usize, line: &str) -> LineResult {
    let id = format!("batch_req_{index}");
    let fail = |custom_id: Value, message: String| LineResult {
        line: json!({
            "id": id,
            "custom_id": custom_id,
            "response": null,
            "error": {"code": "invalid_request", "message": message},
        })
        .to_string(),
        ok: false,
        prompt_tokens: 0,
        completion_tokens: 0,
    };
    let v: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            return fail(
                Value::Null,
                format!("line {}: not valid JSON: {e}", index + 1),
            );
        }
    };
    let custom_id = v.get("custom_id").cloned().unwrap_or(Value::Null);
    if !custom_id.is_string() {
        return fail(custom_id, "custom_id must be a string".into());
    }
    let method = v.get("method").and_then(Value::as_str).unwrap_or("POST");
    if method != "POST" {
        return fail(custom_id, format!("method must be POST, got {method}"));
    }
    let url = v.get("url").and_then(Value::as_str).unwrap_or("");
    if url != "/v1/chat/completions" && url != "/v1/completions" {
        return fail(
            custom_id,
            format!("url must be /v1/chat/completions or /v1/completions, got '{url}'"),
        );
    }
    let Some(body) = v.get("body").filter(|b| b.is_object()) else {
        return fail(custom_id, "body must be a JSON object".into());
    };
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return fail(custom_id, "stream is not supported in batches".into());
    }
    let req = Request::post(url)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()));
    let Ok(req) = req else {
        return fail(custom_id, "the request cannot be built".into());
    };
    let Ok(resp) = app(Arc::clone(state)).oneshot(req).await;
    let status = resp.status().as_u16();
    let bytes = to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let usage = |k: &str| body["usage"][k].as_u64().unwrap_or(0);
    let (prompt_tokens, completion_tokens) = (usage("prompt_tokens"), usage("completion_tokens"));
    LineResult {
        line: json!({
            "id": id,
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": id, "body": body},
            "error": null,
        })
        .to_string(),
        ok: status == 200,
        prompt_tokens,
        completion_tokens,
    }
}
