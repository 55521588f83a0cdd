//! Bearer-key check for `/v1/*`, compared in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

pub async fn require_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(key) = state.config.api_key.as_deref() else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // ct_eq on equal-length inputs; lengths differing is not secret
    let ok = given.len() == key.len() && bool::from(given.as_bytes().ct_eq(key.as_bytes()));
    if ok {
        next.run(req).await
    } else {
        // counted by the routes' counter under the route template, never the raw path
        ApiError::unauthorized().into_response()
    }
}
