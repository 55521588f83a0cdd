//! abserve's HTTP server: an OpenAI-compatible API over the one shared engine, with
//! back-pressure, health, readiness and Prometheus metrics. No model code here.

pub mod api;
pub mod auth;
pub mod error;
pub mod experiments;
pub mod health;
pub mod metrics;
pub mod openai;
pub mod state;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

pub use state::{AppState, ServerConfig};

use crate::error::ApiError;

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

/// Serves until SIGTERM/SIGINT (or `stop` resolves). Then /ready turns 503 at once and new
/// requests get 503 while running ones finish (up to the drain timeout); then the listener
/// closes and the function returns.
pub async fn serve(
    state: Arc<AppState>,
    addr: SocketAddr,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    on_bound(listener.local_addr()?);
    state.spawn_drain_meter();
    let st = state.clone();
    let shutdown = async move {
        tokio::select! {
            _ = stop => {}
            _ = signal() => {}
        }
        tracing::info!("shutting down: refusing new requests, draining running ones");
        st.shutting_down.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + st.config.drain_timeout;
        loop {
            let s = st.engine.stats();
            if s.running == 0 && s.waiting == 0 {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!("drain timeout reached with {} running", s.running);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    axum::serve(listener, router(state.clone())).with_graceful_shutdown(shutdown).await?;
    Ok(())
}

async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
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
        _ = ctrl_c => {}
        _ = term => {}
    }
}
