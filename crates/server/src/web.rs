//! The page at `/`: a chat playground over the server's own streaming API and a live view
//! of the engine over `GET /v1/strata/events` ([`crate::events`]).
//!
//! A key design decision made here is that the page is three plain files (HTML, CSS,
//! JavaScript, in `assets/`) compiled into the binary: no front-end toolchain, no build
//! step, no CDN, so the page works offline and is exactly what the repository holds.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page.
pub async fn index() -> Response {
    asset(
        "text/html; charset=utf-8",
        include_str!("../assets/index.html"),
    )
}

/// The page's script.
pub async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../assets/app.js"),
    )
}

/// The page's style sheet.
pub async fn style() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../assets/style.css"),
    )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // A restarted server may serve a newer page: browsers check again each time.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
