//! The experiment dashboard: static assets embedded in the binary (no CDN, works offline)
//! served at `/`, and the JSON it reads besides the experiments API:
//!
//! - `GET /v1/engine`: the one model's live state (memory against the plan, KV cells, running
//!   and waiting sequences, token counters, each experiment's KV cells against its quota);
//! - `GET /v1/experiments/{name}/history?points=N`: the results over the first k, 2k, … units
//!   (for the chart of the estimate and its interval over units);
//! - `GET /v1/experiments/{name}/exposures?limit=N`: the latest exposures (no prompt text; an
//!   experiment with `samples` keeps its sampled conversations apart: `samples`, and the review
//!   page `review.js`).
//!
//! The pages themselves carry no data, so they are served without a key; every data route is
//! under `/v1` and follows its API-key rule. The page's Content-Security-Policy allows only its
//! own script and style: the script builds the DOM with text nodes, never HTML from data.

use std::sync::Arc;

use abserve_engine::plan::{current_rss, peak_rss};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::ControlPlane;
use crate::error::ApiError;

const INDEX: &str = include_str!("../../dashboard/index.html");
const SCRIPT: &str = include_str!("../../dashboard/app.js");
const REVIEW: &str = include_str!("../../dashboard/review.js");
const STYLE: &str = include_str!("../../dashboard/app.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}

pub async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

pub async fn review_script() -> Response {
    asset(REVIEW, "text/javascript; charset=utf-8")
}

pub async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

/// What the page needs to know before it asks for data: whether to ask for a key first (the
/// same fact a 401 from `/v1` would tell).
pub async fn config(State(cp): State<Arc<ControlPlane>>) -> Response {
    let mut r = Json(json!({"auth_required": cp.auth_required})).into_response();
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

/// The default model's live state, for the dashboard's gauges (polled every second), and the
/// id and owner of every model of the registry.
#[utoipa::path(get, path = "/v1/engine", responses((status = 200, body = Object)))]
pub async fn engine(State(cp): State<Arc<ControlPlane>>) -> Response {
    let model = cp.models.default_entry();
    let plan = model.plan();
    let s = model.stats();
    // per experiment in flight; its quota is in its definition (GET /v1/experiments/NAME)
    let experiments: Vec<Value> = cp
        .metrics
        .experiment_kv()
        .into_iter()
        .map(|(name, now, peak)| json!({"name": name, "kv_cells": now, "kv_cells_peak": peak}))
        .collect();
    let device_plan = plan.and_then(|p| p.device.as_ref());
    let device = model.tokens().and_then(|t| t.device()).map(|d| {
        let m = d.memory();
        json!({"name": m.name, "total_bytes": m.total_bytes, "free_bytes": m.free_bytes, "used_bytes": m.used_bytes(),
               "planned_bytes": device_plan.map(|p| p.planned_bytes), "budget_bytes": device_plan.map(|p| p.budget_bytes)})
    });
    let models: Vec<Value> = cp
        .models
        .iter()
        .map(|m| json!({"id": m.id, "owned_by": m.owned_by()}))
        .collect();
    Json(json!({
        "model": model.id,
        "models": models,
        "uptime_s": cp.started.elapsed().as_secs_f64(),
        "alive": model.alive().is_ok(),
        "memory": {"resident_bytes": current_rss(), "peak_resident_bytes": peak_rss(),
                   "planned_bytes": plan.map(|p| p.planned_bytes), "budget_bytes": plan.map(|p| p.budget_bytes),
                   "margin_bytes": plan.map(|p| p.margin_bytes)},
        "kv": {"total": s.kv_cells_total, "used": s.kv_cells_used, "cached": s.kv_cells_cached,
               "free": s.kv_cells_total.saturating_sub(s.kv_cells_used + s.kv_cells_cached), "peak": s.kv_cells_peak},
        "running": s.running,
        "waiting": s.waiting,
        "max_queue": model.capacity().max_queue,
        "seq_slots": model.capacity().seq_slots,
        "generated_tokens": s.generated_tokens,
        "prompt_tokens": s.prompt_tokens,
        "completed": s.completed,
        "experiments": experiments,
        "device": device,
    }))
    .into_response()
}

#[derive(Deserialize)]
pub struct HistoryQuery {
    points: Option<usize>,
}

/// The results over the first k, 2k, … units and all of them, up to `points` (1-100, default 20).
#[utoipa::path(get, path = "/v1/experiments/{name}/history", params(("name" = String, Path, description = "the experiment's name"), ("points" = Option<usize>, Query, description = "most points, 1-100 (default 20)")), responses((status = 200, body = Object)))]
pub async fn history(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<HistoryQuery>,
) -> Result<Response, ApiError> {
    let points = q.points.unwrap_or(20);
    if !(1..=100).contains(&points) {
        return Err(ApiError::invalid_param(
            "points",
            "points must be between 1 and 100",
        ));
    }
    let (ab, e) = (cp.ab()?, cp.find(&name)?);
    Ok(
        Json(json!({"experiment": e.name, "points": ab.store().history(&e, points).await?}))
            .into_response(),
    )
}

#[derive(Deserialize)]
pub struct ExposuresQuery {
    limit: Option<u32>,
}

/// The latest exposures, newest first (1-500, default 50).
#[utoipa::path(get, path = "/v1/experiments/{name}/exposures", params(("name" = String, Path, description = "the experiment's name"), ("limit" = Option<u32>, Query, description = "most exposures, 1-500 (default 50)")), responses((status = 200, body = Object)))]
pub async fn exposures(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<ExposuresQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid_param(
            "limit",
            "limit must be between 1 and 500",
        ));
    }
    let (ab, e) = (cp.ab()?, cp.find(&name)?);
    Ok(Json(json!({"experiment": e.name, "exposures": ab.store().recent_exposures(&e.name, limit).await?})).into_response())
}
