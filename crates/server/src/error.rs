//! Errors in OpenAI's JSON shape, `{"error": {"message", "type", "param", "code"}}`, with the
//! status code a client SDK maps to the right exception.

use abserve_engine::prepare::PrepareError;
use abserve_protocol::wire::{ErrorBody, ErrorObject};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::bad_request(message);
        e.param = Some(param.to_string());
        e.code = Some("invalid_value");
        e
    }
    /// A generation that ended without an answer: 500 for an internal engine error (a bug, the
    /// state named), 400 for a grammar that failed during generation, else 503 (the engine is stopping, or out of memory without admission
    /// control).
    pub fn generation(e: abserve_engine::GenerationError) -> Self {
        match e {
            abserve_engine::GenerationError::Internal(_) => Self::internal(e.to_string()),
            // the request's own grammar passed a per-step limit: its fault, as a compile error is
            abserve_engine::GenerationError::Grammar(_) => {
                Self::invalid_param("response_format", e.to_string())
            }
            abserve_engine::GenerationError::Upstream { status, message } => {
                let (code, kind) = match status {
                    400 => (StatusCode::BAD_REQUEST, "invalid_request_error"),
                    502 => (StatusCode::BAD_GATEWAY, "server_error"),
                    504 => (StatusCode::GATEWAY_TIMEOUT, "server_error"),
                    _ => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
                };
                Self::new(code, kind, message)
            }
            e => Self::unavailable(e.to_string()),
        }
    }
    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'.",
        );
        e.code = Some("invalid_api_key");
        e
    }
    /// A key whose role may not call the route (the message names the role it needs).
    pub fn forbidden(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::FORBIDDEN, "permission_error", message);
        e.code = Some("insufficient_role");
        e
    }
    /// A 403 for a role that may call the route but not on this object (`code` says why).
    pub fn forbidden_because(code: &'static str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::FORBIDDEN, "permission_error", message);
        e.code = Some(code);
        e
    }
    pub fn model_not_found(model: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "The model '{model}' does not exist. GET /v1/models lists the models served here."
            ),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }
    /// 409: the request conflicts with the current state (an existing name, a run under way).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "invalid_request_error", message)
    }
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", what)
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The request body is larger than the limit of {limit} bytes."),
        )
    }
    pub fn overloaded(message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            message,
        );
        e.code = Some("rate_limit_exceeded");
        e.retry_after = Some(retry_after.max(1));
        e
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        )
    }
    pub fn insufficient_storage(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INSUFFICIENT_STORAGE, "server_error", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }
    pub fn unsupported_media_type() -> Self {
        let mut e = Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            "Send the body as JSON with 'Content-Type: application/json'.",
        );
        e.code = Some("unsupported_media_type");
        e
    }
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "Method not allowed on this path.",
        )
    }

    pub fn body(&self) -> ErrorBody {
        let error = ErrorObject {
            message: self.message.clone(),
            kind: Some(self.kind.to_string()),
            param: self.param.clone(),
            code: self.code.map(str::to_string),
        };
        ErrorBody { error }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

impl From<PrepareError> for ApiError {
    /// A request the preparation stage refused: 400 naming the field, or 429 when it is valid
    /// but what it needs is held by running requests now (`PrepareError::retry`).
    fn from(e: PrepareError) -> Self {
        if e.retry {
            let mut r = ApiError::overloaded(e.message, 1);
            r.param = Some(e.field);
            return r;
        }
        ApiError::invalid_param(&e.field, e.message)
    }
}
