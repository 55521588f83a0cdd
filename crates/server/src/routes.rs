//! The routes: `/v1` (OpenAI API and experiments, behind the API key), health, readiness and
//! metrics; axum's own plain-text rejections rewritten into OpenAI's error shape.
//!
//! Who may call which `/v1` route: `auth` (keys with roles, 401/403, the audit log).
//!
//! Every matched request is counted in `abserve_requests_total` under its route *template*
//! (`chat_completions`, `experiments_name_events`, ...), never its raw path; requests no route
//! matches share the label `unmatched`, so no client can grow the metrics.
//!
//! Cross-site safety: a `POST`/`PUT` to `/v1` must say `Content-Type: application/json` (else
//! 415), which makes every cross-site write a CORS-preflighted request; CORS is off unless
//! `--cors-origin` names origins, so a web page elsewhere cannot write even without an API key.
//!
//! The dashboard's page and assets (`/`, `/dashboard/*`) carry no data and need no key; the
//! data they show comes from `/v1`, behind it.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::error::ApiError;
use crate::inference::{api, fanout};
use crate::state::AppState;
use crate::{auth, experiments, health, openapi};

pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.body_limit;
    let control = state.experiments.clone();
    let inference = Router::new()
        .route("/chat/completions", post(api::chat))
        .route("/completions", post(api::completions))
        .route("/models", get(api::models))
        .route("/me", get(auth::me))
        .route("/experiments/{name}/fanout", post(fanout::fanout))
        .with_state(state.clone());
    let v1 = inference
        .merge(experiments::api(control.clone()))
        .route_layer(from_fn(require_json))
        .route_layer(from_fn_with_state(state.clone(), auth::authorize));
    let operations = Router::new()
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(openapi::openapi_json))
        .with_state(state.clone());
    let fallback_state = state.clone();
    let mut app = Router::new()
        .nest("/v1", v1)
        .merge(experiments::pages(control))
        .merge(operations)
        .route_layer(from_fn_with_state(state.clone(), count))
        .fallback(move || async move {
            fallback_state.metrics.count("unmatched", 404);
            ApiError::not_found("Unknown path.").into_response()
        })
        .layer(axum::middleware::map_response(move |r: Response| {
            openai_errors(r, limit)
        }))
        .layer(DefaultBodyLimit::max(limit));
    if let Some(cors) = cors(&state.config.cors_origins) {
        app = app.layer(cors);
    }
    app
}

pub fn ops_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .fallback(|| async { ApiError::not_found("Unknown path.").into_response() })
        .with_state(state)
}

/// CORS for the origins `--cors-origin` names (none: no CORS headers at all, browsers keep
/// other sites' pages out).
fn cors(origins: &[String]) -> Option<CorsLayer> {
    let list: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    if list.is_empty() {
        return None;
    }
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(list))
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]),
    )
}

/// The metrics label of a route template: `/v1/experiments/{name}/events` → `experiments_name_events`.
fn label(template: &str) -> String {
    let l = template
        .trim_start_matches("/v1")
        .trim_start_matches('/')
        .replace(['/', '.'], "_")
        .replace(['{', '}'], "");
    if l.is_empty() {
        "dashboard".into()
    } else {
        l
    }
}

/// Counts a matched request under its route template.
async fn count(
    State(state): State<Arc<AppState>>,
    path: Option<MatchedPath>,
    req: Request,
    next: Next,
) -> Response {
    let endpoint = path
        .map(|p| label(p.as_str()))
        .unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    state.metrics.count(&endpoint, resp.status().as_u16());
    resp
}

/// `POST`/`PUT` bodies must be declared as JSON (a `text/plain` form post from another site is
/// refused before it is read); an experiment definition may also be `application/toml`, which no
/// cross-site form can send either.
async fn require_json(req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::POST | Method::PUT) {
        let media = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|m| m.trim().to_ascii_lowercase())
            .unwrap_or_default();
        let experiment_write = req
            .uri()
            .path()
            .trim_end_matches('/')
            .ends_with("/experiments")
            || (req.method() == Method::PUT && req.uri().path().contains("/experiments/"));
        if !(media == "application/json" || (media == "application/toml" && experiment_write)) {
            return ApiError::unsupported_media_type().into_response();
        }
    }
    next.run(req).await
}

/// Rewrites axum's own plain-text rejections (body too large, wrong method) into OpenAI's shape.
async fn openai_errors(r: Response, limit: usize) -> Response {
    let is_json = r
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.starts_with("application/json")
                || v.starts_with("text/event-stream")
                || v.starts_with("text/plain; version")
        });
    if is_json || r.status().is_success() {
        return r;
    }
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(limit).into_response(),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::method_not_allowed().into_response(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE
        | StatusCode::BAD_REQUEST
        | StatusCode::UNPROCESSABLE_ENTITY => {
            ApiError::bad_request("The request could not be read.").into_response()
        }
        _ => r,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_come_from_templates() {
        assert_eq!(super::label("/v1/chat/completions"), "chat_completions");
        assert_eq!(
            super::label("/v1/experiments/{name}/events"),
            "experiments_name_events"
        );
        assert_eq!(super::label("/health"), "health");
    }
}
