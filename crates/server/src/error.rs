//! Errors: [`ApiError`], what a client is told, and [`ServerError`], why the server could
//! not run.
//!
//! A key design decision made here is that an [`ApiError`] only ever carries a message
//! written for the client (what in the request is wrong, and which parameter); internal
//! failures are logged where they happen and reach the client as a generic 500.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for the client.
    pub message: String,
    /// The parameter at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about the request.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// Any status, with a message.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            ..ApiError::invalid(message)
        }
    }

    /// A 500 that hides the cause (log it before).
    pub fn internal() -> ApiError {
        ApiError::with_status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the server failed to complete the request",
        )
    }

    /// Names the parameter at fault.
    pub fn param(mut self, param: impl Into<String>) -> ApiError {
        self.param = Some(param.into());
        self
    }

    /// Sets the machine-readable code.
    pub fn code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// OpenAI's error type for the status.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        crate::json_response(self.status, &self.body())
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding or serving the socket failed.
    #[error("serving on {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
}
