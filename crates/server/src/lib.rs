//! Strata's OpenAI-compatible HTTP server.
//!
//! [`app`] builds the axum router over an [`AppState`] (the engine, its
//! [`Scheduler`] and the [`metrics::Metrics`]); [`run`] serves it on a socket until
//! SIGTERM or Ctrl-C, then drains the requests in flight. Endpoints: `POST
//! /v1/chat/completions` and `POST /v1/completions` (streamed as server-sent events or
//! not), `GET /v1/models`, `GET /health`, `GET /metrics`. Every request is logged in one
//! line when it ends (`log`).
//!
//! A key design decision made here is that every request holds a guard that cancels its
//! sequences when dropped: when a client disconnects, hyper drops the handler's future or
//! the response stream, and the sequences leave the batch before its next step, whether
//! the request streamed or not.
//!
//! ```
//! use std::path::Path;
//! use std::sync::Arc;
//!
//! use axum::body::{Body, to_bytes};
//! use axum::http::{Request, StatusCode};
//! use strata_model::Precision;
//! use strata_runtime::engine::Engine;
//! use strata_runtime::scheduler::SchedulerConfig;
//! use strata_server::{AppState, app};
//! use tower::ServiceExt;
//!
//! // The tiny test model kept in the repository, served in process (no socket).
//! let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
//! let engine = Arc::new(Engine::load(&dir, Precision::Fast)?);
//! let config = SchedulerConfig {
//!     max_batch: 4,
//!     max_queue: 8,
//!     step_tokens: 64,
//!     ctx_size: 256,
//!     prefix_cache_bytes: 0,
//! };
//! let state = Arc::new(AppState::new(engine, config, "strata-tiny-moe".into()));
//! let body = serde_json::json!({
//!     "model": "strata-tiny-moe", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
//! });
//! let request = Request::post("/v1/completions")
//!     .header("content-type", "application/json")
//!     .body(Body::from(body.to_string()))?;
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let (status, body) = rt.block_on(async {
//!     let response = app(Arc::clone(&state)).oneshot(request).await?;
//!     let status = response.status();
//!     let body = to_bytes(response.into_body(), usize::MAX).await?;
//!     Ok::<_, Box<dyn std::error::Error>>((status, body))
//! })?;
//! assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
//! let json: serde_json::Value = serde_json::from_slice(&body)?;
//! println!("Once upon a time{}", json["choices"][0]["text"].as_str().unwrap_or_default());
//! assert!(json["usage"]["completion_tokens"].as_u64() <= Some(4));
//! state.scheduler.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub mod api;
pub mod error;
pub mod events;
mod generate;
mod log;
pub mod metrics;
pub mod offline;
mod structured;
mod tools;
mod web;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use strata_runtime::engine::Engine;
use strata_runtime::scheduler::{Scheduler, SchedulerConfig};

pub use error::{ApiError, ServerError};

/// Largest request body accepted, in bytes.
pub const DEFAULT_MAX_BODY: usize = 4 << 20;

/// glibc malloc arenas a server process runs with (`strata_kernels::limit_malloc_arenas`,
/// set before the model loads; `MALLOC_ARENA_MAX` overrides). With glibc's default (eight
/// per core) a 128 MiB prefix cache left `strata serve` on SmolLM2-135M at 361-373 MiB
/// of VmRSS after churn, 150-180 MiB more than without the cache; with one arena at 318-324
/// MiB, 137-143 MiB more, at the same request rate (docs/benchmarks.md, 2026-11-29).
pub const MALLOC_ARENAS: usize = 1;

/// What the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The model, tokenizer and chat template.
    pub engine: Arc<Engine>,
    /// The continuous-batching scheduler.
    pub scheduler: Arc<Scheduler>,
    /// Counters and histograms.
    pub metrics: metrics::Metrics,
    /// The id clients name the model by.
    pub model_id: String,
    /// When the server started (Unix seconds), reported as the model's creation time.
    pub created: u64,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// More metrics for `/metrics` (the hybrid executor's); `None` by default.
    pub extra_metrics: Option<Arc<dyn metrics::MetricsSource>>,
    /// The page's live view: routing counts and recent throughput.
    pub live: events::Live,
}

impl AppState {
    /// Starts a scheduler for `engine` and wraps both.
    pub fn new(engine: Arc<Engine>, config: SchedulerConfig, model_id: String) -> AppState {
        let scheduler = Arc::new(Scheduler::start(Arc::clone(&engine), config));
        AppState {
            scheduler,
            metrics: metrics::Metrics::default(),
            model_id,
            created: unix_now(),
            max_body: DEFAULT_MAX_BODY,
            extra_metrics: None,
            live: events::Live::new(engine.model.config()),
            engine,
        }
    }
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The router with every endpoint.
pub fn app(state: Arc<AppState>) -> Router {
    let limit = state.max_body;
    Router::new()
        .route("/v1/chat/completions", post(generate::chat_completions))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/", get(web::index))
        .route("/assets/app.js", get(web::script))
        .route("/assets/style.css", get(web::style))
        .route("/v1/strata/events", get(events::stream))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(log::log_request))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(value.to_string()),
    )
        .into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "object": "list",
            "data": [{
                "id": st.model_id,
                "object": "model",
                "created": st.created,
                "owned_by": "strata",
                "max_model_len": st.scheduler.config().ctx_size,
            }],
        }),
    )
}

async fn health() -> Response {
    json_response(StatusCode::OK, &serde_json::json!({"status": "ok"}))
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    let mut text = st
        .metrics
        .render(st.scheduler.queued(), st.scheduler.active());
    metrics::render_prefix_cache(&mut text, &st.scheduler);
    if let Some(extra) = &st.extra_metrics {
        extra.render(&mut text);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn not_found() -> ApiError {
    ApiError::with_status(StatusCode::NOT_FOUND, "no such endpoint").code("not_found")
}

/// Resolves when the process receives SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down: draining requests in flight");
}

/// Serves `state` on `addr` until `shutdown` resolves, then waits for the requests in
/// flight to finish and stops the scheduler. Builds its own tokio runtime.
pub fn run(
    addr: SocketAddr,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let io = |source| ServerError::Io {
        addr: addr.to_string(),
        source,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(io)?;
    let scheduler = Arc::clone(&state.scheduler);
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(io)?;
        let local = listener.local_addr().map_err(io)?;
        tracing::info!(%local, model = %state.model_id, "listening");
        events::start(&state);
        let live = Arc::clone(&state);
        let shutdown = async move {
            shutdown.await;
            live.live.close();
        };
        axum::serve(listener, app(state))
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(io)
    })?;
    scheduler.shutdown();
    Ok(())
}
