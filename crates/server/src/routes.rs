//! The routes: `/v1` (OpenAI API and experiments, behind the API key), health, readiness and
//! metrics; axum's own plain-text rejections rewritten into OpenAI's error shape.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;
use crate::{api, auth, experiments, health};

pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.body_limit;
    let v1 = Router::new()
        .route("/chat/completions", post(api::chat))
        .route("/completions", post(api::completions))
        .route("/models", get(api::models))
        .route("/experiments", get(experiments::list).post(experiments::create))
        .route(
            "/experiments/{name}",
            get(experiments::get).put(experiments::put).delete(experiments::delete),
        )
        .route("/experiments/{name}/fanout", post(experiments::fanout))
        .route("/experiments/{name}/events", post(experiments::events))
        .route("/experiments/{name}/results", get(experiments::results))
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_key));
    Router::new()
        .nest("/v1", v1)
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .fallback(|| async { ApiError::not_found("Unknown path.").into_response() })
        .layer(axum::middleware::map_response(move |r: Response| openai_errors(r, limit)))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Rewrites axum's own plain-text rejections (body too large, wrong method) into OpenAI's shape.
async fn openai_errors(r: Response, limit: usize) -> Response {
    let is_json = r
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/event-stream") || v.starts_with("text/plain; version"));
    if is_json || r.status().is_success() {
        return r;
    }
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(limit).into_response(),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::method_not_allowed().into_response(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE | StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => {
            ApiError::bad_request("The request could not be read.").into_response()
        }
        _ => r,
    }
}

