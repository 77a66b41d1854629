//! API errors in each API's own JSON shape.
//!
//! OpenAI: `{"error": {"message", "type", "param", "code"}}`.
//! Anthropic: `{"type": "error", "error": {"type", "message"}}`.
//! The route decides the shape ([`Flavor`]); the status code and the
//! message are the same either way.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use serde_json::json;

/// Which API's error shape to answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `/v1/chat/completions`, `/v1/completions`, `/v1/models` and every
    /// non-API route.
    OpenAi,
    /// `/v1/messages`.
    Anthropic,
}

impl Flavor {
    /// The shape a request path is answered in.
    pub fn for_path(path: &str) -> Flavor {
        if path.starts_with("/v1/messages") {
            Flavor::Anthropic
        } else {
            Flavor::OpenAi
        }
    }
}

/// What went wrong, independent of the API shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed JSON, a missing or out-of-range field (400).
    InvalidRequest,
    /// Missing or wrong API key (401).
    Authentication,
    /// A web page from an origin the server does not trust (403).
    Forbidden,
    /// Unknown model or route (404).
    NotFound,
    /// The route exists, but not for this method (405).
    MethodNotAllowed,
    /// The body is over the limit (413).
    TooLarge,
    /// The queue is full (429).
    RateLimit,
    /// Too many open connections (503).
    Overloaded,
    /// The engine failed (500).
    Server,
}

impl ErrorKind {
    fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RateLimit => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Server => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` and `code`.
    fn openai(self) -> (&'static str, &'static str) {
        match self {
            ErrorKind::InvalidRequest => ("invalid_request_error", "invalid_request"),
            ErrorKind::Authentication => ("authentication_error", "invalid_api_key"),
            ErrorKind::Forbidden => ("permission_error", "forbidden_origin"),
            ErrorKind::NotFound => ("invalid_request_error", "not_found"),
            ErrorKind::MethodNotAllowed => ("invalid_request_error", "method_not_allowed"),
            ErrorKind::TooLarge => ("invalid_request_error", "request_too_large"),
            ErrorKind::RateLimit => ("rate_limit_error", "rate_limit_exceeded"),
            ErrorKind::Overloaded => ("server_error", "overloaded"),
            ErrorKind::Server => ("server_error", "internal_error"),
        }
    }

    /// Anthropic's `error.type`.
    fn anthropic(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::Forbidden => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::MethodNotAllowed => "invalid_request_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Overloaded => "overloaded_error",
            ErrorKind::Server => "api_error",
        }
    }
}

/// An error answer: kind, message, shape, and for 429 a `Retry-After`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    pub flavor: Flavor,
    /// Seconds for `Retry-After` (429 only).
    pub retry_after: Option<u64>,
    /// The request field at fault (OpenAI's `param`).
    pub param: Option<&'static str>,
}

impl ApiError {
    /// An error of `kind` in the OpenAI shape (see [`ApiError::flavor`]).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            flavor: Flavor::OpenAi,
            retry_after: None,
            param: None,
        }
    }

    /// 400 with a message.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param),
            ..Self::invalid(message)
        }
    }

    /// Answer in `flavor`'s shape.
    pub fn flavor(mut self, flavor: Flavor) -> Self {
        self.flavor = flavor;
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The JSON body (also sent as an SSE `error` event once a stream started).
    pub fn body(&self) -> serde_json::Value {
        match self.flavor {
            Flavor::OpenAi => {
                let (ty, code) = self.kind.openai();
                json!({"error": {"message": self.message, "type": ty, "param": self.param, "code": code}})
            }
            Flavor::Anthropic => json!({
                "type": "error",
                "error": {"type": self.kind.anthropic(), "message": self.message}
            }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = super::json_response(self.status(), &self.body());
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        resp
    }
}
