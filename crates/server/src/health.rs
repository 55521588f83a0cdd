//! `/health` (liveness: the engine thread is alive), `/ready` (readiness: a real 1-token
//! generation through the scheduler's priority lane plus the memory margin, and the device's
//! memory within its budget when layers are offloaded; cached for a few seconds) and `/metrics` (Prometheus text format).

use std::sync::Arc;
use std::time::Instant;

use abserve_engine::plan::current_rss;
use abserve_engine::{Request, SamplingParams};
use abserve_protocol::abserve::{Health, Ready, ReadyDevice, ReadyMemory, ReadyPlan};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::state::AppState;

/// Liveness: every model's engine thread is alive.
#[utoipa::path(get, path = "/health", responses((status = 200, body = Health)))]
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let ids = state.model_ids();
    match state.engines().zip(&ids).find(|(e, _)| !e.is_alive()) {
        None => Json(Health {
            status: "ok".into(),
        })
        .into_response(),
        Some((e, id)) => {
            let cause = e.failure().map_or(String::new(), |c| format!(" ({c})"));
            let whose = if ids.len() > 1 {
                format!(" of model '{id}'")
            } else {
                String::new()
            };
            ApiError::unavailable(format!("The engine thread{whose} has stopped{cause}."))
                .into_response()
        }
    }
}

async fn probe(state: &AppState) -> Result<Ready, String> {
    if state.is_shutting_down() {
        return Err("shutting down".into());
    }
    let t0 = Instant::now();
    // every model answers a real 1-token generation
    for (i, id) in state.model_ids().iter().enumerate() {
        probe_model(state.engine_at(i))
            .await
            .map_err(|e| format!("model '{id}': {e}"))?;
    }
    let latency = t0.elapsed();
    let plan = state.engine.plan();
    let rss = current_rss();
    // the models' budgets are shares of one budget (`models.rs`): the process is held to the sum
    let limit: u64 = state.engines().map(|e| e.plan().budget_bytes).sum();
    let planned: u64 = state.engines().map(|e| e.plan().planned_bytes).sum();
    let margin: u64 = state.engines().map(|e| e.plan().margin_bytes).sum();
    let s = state.engine.stats();
    let body = Ready {
        status: "ready".into(),
        model: state.config.model_id.clone(),
        probe_latency_ms: latency.as_secs_f64() * 1e3,
        memory: ReadyMemory {
            rss_bytes: rss,
            budget_bytes: limit,
            planned_bytes: planned,
            margin_bytes: margin,
        },
        plan: ReadyPlan {
            kv_cells: plan.kv_cells,
            context: plan.context,
            full_context_sequences: plan.full_context_sequences,
            seq_slots: plan.seq_slots,
            kv_cells_per_slot: plan.kv_cells_per_slot,
            kv_unified: plan.kv_unified,
        },
        kv_cells_used: s.kv_cells_used,
        running: s.running,
        waiting: s.waiting,
        max_queue: state.engine.max_queue() as u64,
        device: device_state(state),
    };
    if rss > limit {
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

/// One model's real 1-token generation through its scheduler's priority lane.
async fn probe_model(engine: &dyn crate::engine_api::EngineApi) -> Result<(), String> {
    if !engine.is_alive() {
        return Err("engine thread has stopped".into());
    }
    let prompt = abserve_engine::prepare::text_tokens(engine, "ready");
    let req = Request {
        prompt,
        params: SamplingParams::greedy(1),
        group: None,
        priority: true,
        kv_share: None,
        constraint: None,
        adapters: Default::default(),
        lease: Default::default(),
    };
    let rx = engine
        .submit(req)
        .map_err(|e| format!("probe not accepted: {e}"))?;
    match tokio::time::timeout(
        std::time::Duration::from_secs(30),
        abserve_engine::collect(rx),
    )
    .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(format!("probe generation failed: {e}")),
        Err(_) => return Err("probe generation took longer than 30 s".into()),
    }
    Ok(())
}

/// The device's memory now and its plan, when layers are offloaded.
fn device_state(state: &AppState) -> Option<ReadyDevice> {
    let (dev, plan) = (state.engine.device()?, state.engine.plan().device.as_ref()?);
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
        .engines()
        .filter_map(|e| e.plan().device.as_ref().map(part))
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
