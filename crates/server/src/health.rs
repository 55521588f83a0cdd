//! `/health` (liveness: the engine thread is alive), `/ready` (readiness: a real 1-token
//! generation through the scheduler's priority lane plus the memory margin, and the device's
//! memory within its budget when layers are offloaded; cached for a few seconds) and `/metrics` (Prometheus text format).

use std::sync::Arc;
use std::time::Instant;

use abserve_engine::plan::current_rss;
use abserve_protocol::abserve::{Health, Ready, ReadyDevice, ReadyMemory, ReadyPlan};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::state::AppState;

/// Liveness: every model of the registry can answer.
#[utoipa::path(get, path = "/health", responses((status = 200, body = Health)))]
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state
        .models
        .iter()
        .find_map(|m| m.alive().err().map(|why| (&m.id, why)))
    {
        None => Json(Health {
            status: "ok".into(),
        })
        .into_response(),
        Some((id, why)) => {
            let whose = if state.models.len() > 1 {
                format!("Model '{id}': ")
            } else {
                String::new()
            };
            ApiError::unavailable(format!("{whose}{why}.")).into_response()
        }
    }
}

async fn probe(state: &AppState) -> Result<Ready, String> {
    if state.is_shutting_down() {
        return Err("shutting down".into());
    }
    let t0 = Instant::now();
    // every model answers a real 1-token generation
    for m in state.models.iter() {
        m.probe()
            .await
            .map_err(|e| format!("model '{}': {e}", m.id))?;
    }
    let latency = t0.elapsed();
    let model = state.models.default_entry();
    let rss = current_rss();
    // the budgets of the models this process runs are shares of one budget (`models.rs`): the
    // process is held to the sum
    let limit: u64 = state.models.plans().map(|p| p.budget_bytes).sum();
    let planned: u64 = state.models.plans().map(|p| p.planned_bytes).sum();
    let margin: u64 = state.models.plans().map(|p| p.margin_bytes).sum();
    let s = model.stats();
    let capacity = model.capacity();
    let plan = model.plan();
    let body = Ready {
        status: "ready".into(),
        model: model.id.clone(),
        probe_latency_ms: latency.as_secs_f64() * 1e3,
        memory: ReadyMemory {
            rss_bytes: rss,
            budget_bytes: limit,
            planned_bytes: planned,
            margin_bytes: margin,
        },
        plan: ReadyPlan {
            kv_cells: plan.map_or(0, |p| p.kv_cells),
            context: capacity.context as u64,
            full_context_sequences: plan.map_or(0, |p| p.full_context_sequences),
            seq_slots: capacity.seq_slots as u64,
            kv_cells_per_slot: plan.map_or(0, |p| p.kv_cells_per_slot),
            kv_unified: plan.is_some_and(|p| p.kv_unified),
        },
        kv_cells_used: s.kv_cells_used,
        running: s.running,
        waiting: s.waiting,
        max_queue: capacity.max_queue as u64,
        device: device_state(state),
    };
    if limit > 0 && rss > limit {
        return Err(format!(
            "resident memory {rss} B is above the budget {limit} B"
        ));
    }
    if let Some(d) = &body.device {
        let ours = d.used_bytes.saturating_sub(d.used_before_bytes);
        if ours > d.budget_bytes {
            return Err(format!(
                "device {} memory in use by abserve {ours} B (used {} B of {} B, {} B before start) is above the device budget {} B",
                d.name, d.used_bytes, d.total_bytes, d.used_before_bytes, d.budget_bytes
            ));
        }
    }
    Ok(body)
}

/// The device's memory now and its plan, when layers are offloaded.
fn device_state(state: &AppState) -> Option<ReadyDevice> {
    let model = state.models.default_entry();
    let (dev, plan) = (model.tokens()?.device()?, model.plan()?.device.as_ref()?);
    let m = dev.memory();
    Some(ReadyDevice {
        name: m.name.clone(),
        total_bytes: m.total_bytes,
        free_bytes: m.free_bytes,
        used_bytes: m.used_bytes(),
        used_before_bytes: plan.used_before_bytes,
        // several models share the device's budget (`models.rs`): abserve is held to the sum
        budget_bytes: device_sum(state, |d| d.budget_bytes),
        planned_bytes: device_sum(state, |d| d.planned_bytes),
    })
}

fn device_sum(state: &AppState, part: fn(&abserve_engine::plan::DevicePlan) -> u64) -> u64 {
    state
        .models
        .plans()
        .filter_map(|p| p.device.as_ref().map(part))
        .sum()
}

/// Readiness: a real 1-token generation ran and memory is within the plan.
#[utoipa::path(get, path = "/ready", responses((status = 200, body = Ready)))]
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    if state.is_shutting_down() {
        return ApiError::unavailable("not ready: shutting down").into_response();
    }
    let mut cache = state.ready.lock().await;
    let fresh = cache
        .as_ref()
        .is_some_and(|(t, _)| t.elapsed() < state.config.ready_cache);
    if !fresh {
        let r = probe(&state).await;
        *cache = Some((Instant::now(), r));
    }
    match &cache.as_ref().expect("filled above").1 {
        Ok(body) => Json(body.clone()).into_response(),
        Err(reason) => ApiError::unavailable(format!("not ready: {reason}")).into_response(),
    }
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    match state.metrics.render() {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("metrics could not be encoded: {e}")).into_response(),
    }
}
