//! One log line per request: method, path, status, tokens and duration.
//!
//! A key design decision: the line is written when the response ends, not when its head is
//! sent, so a streamed generation is logged with all its tokens and its whole duration
//! (when the last event is sent or the client leaves). Handlers that generate attach a
//! [`Tally`] to their response, which the stream keeps counting into.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;

/// A generation request's tokens, counted while it runs.
#[derive(Debug)]
pub(crate) struct Tally {
    /// Prompt tokens of every prompt and choice.
    pub prompt: usize,
    completion: AtomicU64,
}

impl Tally {
    /// A tally of `prompt` tokens and no completion yet.
    pub fn new(prompt: usize) -> Arc<Tally> {
        Arc::new(Tally {
            prompt,
            completion: AtomicU64::new(0),
        })
    }

    /// Counts one generated token.
    pub fn token(&self) {
        self.completion.fetch_add(1, Ordering::Relaxed);
    }
}

/// `res`, carrying `tally` for the request's log line.
pub(crate) fn tagged(mut res: Response, tally: &Arc<Tally>) -> Response {
    res.extensions_mut().insert(Arc::clone(tally));
    res
}

/// The log line of one request, written when dropped.
struct Line {
    method: Method,
    path: String,
    status: StatusCode,
    tally: Option<Arc<Tally>>,
    started: Instant,
}

impl Drop for Line {
    fn drop(&mut self) {
        let ms = self.started.elapsed().as_secs_f64() * 1e3;
        let (method, path, status) = (&self.method, &self.path, self.status.as_u16());
        match &self.tally {
            Some(t) => tracing::info!(
                "{method} {path} {status} prompt_tokens={} completion_tokens={} {ms:.1} ms",
                t.prompt,
                t.completion.load(Ordering::Relaxed)
            ),
            None => tracing::info!("{method} {path} {status} {ms:.1} ms"),
        }
    }
}

/// Middleware: logs each request once, when its response (a stream included) ends.
pub(crate) async fn log_request(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let res = next.run(req).await;
    let line = Line {
        method,
        path,
        status: res.status(),
        tally: res.extensions().get::<Arc<Tally>>().cloned(),
        started,
    };
    let streamed = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streamed {
        // Whole bodies are written at once: log now, and keep their Content-Length.
        return res;
    }
    let (parts, body) = res.into_parts();
    let events = body.into_data_stream().map(move |chunk| {
        // The stream owns the line: it is written when the stream is dropped.
        let _ = &line;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(events))
}
