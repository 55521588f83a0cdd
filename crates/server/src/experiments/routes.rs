//! The control plane over HTTP: experiment CRUD (each variant checked as the request it will
//! produce, by the model it names), outcome events and results. Storage is SQLite or
//! PostgreSQL (`abserve_ab::store`); every 2xx that records something was committed before it
//! was sent.

use std::collections::BTreeSet;
use std::sync::Arc;

use abserve_ab::{Experiment, OutcomeEvent};
use abserve_protocol::abserve::{Deleted, EventsAccepted, List};
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use super::{check_variant, ControlPlane};
use crate::error::ApiError;

/// An experiment from a request body (JSON, or TOML when the body says `application/toml`: one
/// experiment's table, or a file with one `[[experiment]]`), checked as the API checks requests
/// (every variant as the request it will produce), on the blocking pool: its templates are
/// rendered.
async fn parse_experiment(
    cp: &Arc<ControlPlane>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Experiment, ApiError> {
    let toml = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/toml")
        });
    cp.off_thread(move |cp| {
        let e: Experiment = if toml {
            let text = std::str::from_utf8(&body)
                .map_err(|_| ApiError::bad_request("The TOML body is not UTF-8."))?;
            abserve_ab::parse_one(text).map_err(|e| ApiError::bad_request(e.0))?
        } else {
            crate::body::parse_body(&body)?
        };
        e.validate().map_err(|e| ApiError::bad_request(e.0))?;
        for v in &e.variants {
            check_variant(v, cp.models.at(cp.variant_model(v)?))?;
        }
        Ok(e)
    })
    .await
}

/// Every experiment.
#[utoipa::path(get, path = "/v1/experiments", responses((status = 200, description = "`{object: list, data: [experiment]}`", body = Object)))]
pub async fn list(State(cp): State<Arc<ControlPlane>>) -> Result<Response, ApiError> {
    let ab = cp.ab()?;
    let all = ab.list();
    Ok(Json(List::new(all)).into_response())
}

/// Creates an experiment (TOML's fields as JSON, or TOML itself as `application/toml`; every
/// variant checked as the request it will produce).
#[utoipa::path(post, path = "/v1/experiments", request_body(content = abserve_ab::Experiment, description = "the experiment as JSON (or its TOML table with `Content-Type: application/toml`); a guardrail may also be written as a metric's name alone"), responses(
    (status = 201, description = "the experiment as stored", body = abserve_ab::Experiment),
    (status = 409, description = "an experiment of that name exists", body = abserve_protocol::wire::ErrorBody)
))]
pub async fn create(
    State(cp): State<Arc<ControlPlane>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ab = cp.ab()?;
    let e = parse_experiment(&cp, &headers, body).await?;
    // the store decides (one INSERT that fails on conflict): of two concurrent creates of one
    // name exactly one gets 201
    if !ab
        .store()
        .create_experiment(&e)
        .await
        .inspect_err(|_| cp.metrics.store_error("experiment"))?
    {
        let mut err = ApiError::bad_request(format!(
            "An experiment named '{}' exists; PUT /v1/experiments/{} replaces it.",
            e.name, e.name
        ));
        err.status = StatusCode::CONFLICT;
        return Err(err);
    }
    ab.insert(e.clone());
    Ok((StatusCode::CREATED, Json(e)).into_response())
}

/// One experiment.
#[utoipa::path(get, path = "/v1/experiments/{name}", params(("name" = String, Path, description = "the experiment's name")), responses((status = 200, body = abserve_ab::Experiment)))]
pub async fn get_one(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Response, ApiError> {
    Ok(Json(cp.find(&name)?).into_response())
}

/// Replaces an experiment's definition.
#[utoipa::path(put, path = "/v1/experiments/{name}", params(("name" = String, Path, description = "the experiment's name")), request_body = abserve_ab::Experiment, responses((status = 200, body = abserve_ab::Experiment)))]
pub async fn put(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ab = cp.ab()?;
    let e = parse_experiment(&cp, &headers, body).await?;
    if e.name != name {
        return Err(ApiError::invalid_param(
            "name",
            format!("The body names '{}' but the path names '{name}'.", e.name),
        ));
    }
    ab.store()
        .put_experiment(&e)
        .await
        .inspect_err(|_| cp.metrics.store_error("experiment"))?;
    ab.insert(e.clone());
    Ok(Json(e).into_response())
}

/// Deletes an experiment and its sampled conversations (its exposures and events stay).
#[utoipa::path(delete, path = "/v1/experiments/{name}", params(("name" = String, Path, description = "the experiment's name")), responses((status = 200, body = Deleted)))]
pub async fn delete(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Response, ApiError> {
    let ab = cp.ab()?;
    cp.find(&name)?;
    // its sampled conversations go with it (no experiment left to say how long to keep them);
    // its exposures and events stay, as before
    ab.store()
        .delete_samples_before(&name, f64::MAX)
        .await
        .inspect_err(|_| cp.metrics.store_error("samples"))?;
    ab.store()
        .delete_experiment(&name)
        .await
        .inspect_err(|_| cp.metrics.store_error("experiment"))?;
    ab.remove(&name);
    Ok(Json(Deleted {
        id: name,
        object: "experiment".into(),
        deleted: true,
    })
    .into_response())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum EventsBody {
    Batch {
        events: Vec<OutcomeEvent>,
        batch_id: Option<String>,
    },
    Many(Vec<OutcomeEvent>),
    One(OutcomeEvent),
}

/// Records outcome events: one `{unit, metric, value}`, a list of them, or `{batch_id, events}`
/// (a batch id makes a retry idempotent). An inference key posts them only for units its own
/// requests were served for (`only_own_units`); an admin key for any.
#[utoipa::path(post, path = "/v1/experiments/{name}/events", params(("name" = String, Path, description = "the experiment's name")), request_body = Object, responses((status = 200, body = EventsAccepted)))]
pub async fn events(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
    caller: Option<axum::Extension<crate::keys::Caller>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ab = cp.ab()?;
    cp.find(&name)?;
    // one event, a list of events (the documented short form) or a batch object
    let value: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "We could not parse the JSON body of your request: {e}"
        ))
    })?;
    let (events, batch_id) = match serde_json::from_value::<EventsBody>(value)
        .map_err(|e| ApiError::bad_request(format!("Invalid events: {e}")))?
    {
        EventsBody::Batch { events, batch_id } => (events, batch_id),
        EventsBody::Many(v) => (v, None),
        EventsBody::One(e) => (vec![e], None),
    };
    if events.is_empty() || events.len() > 10_000 {
        return Err(ApiError::invalid_param(
            "events",
            "send between 1 and 10000 events",
        ));
    }
    if let Some(bad) = events
        .iter()
        .find(|e| !e.value.is_finite() || e.unit.is_empty() || e.metric.is_empty())
    {
        return Err(ApiError::invalid_param(
            "events",
            format!(
                "event for unit '{}' metric '{}' is invalid (empty name or non-finite value)",
                bad.unit, bad.metric
            ),
        ));
    }
    if let Some(c) = caller.filter(|c| c.role == abserve_protocol::Role::Inference) {
        only_own_units(&cp, &name, &c.name, &events).await?;
    }
    let n = events.len();
    let stored = ab
        .store()
        .record_events(&name, batch_id.as_deref(), &events)
        .await
        .inspect_err(|_| cp.metrics.store_error("events"))?;
    Ok(Json(EventsAccepted {
        accepted: n,
        stored,
        duplicate_batch: stored == 0,
    })
    .into_response())
}

/// Refuses (403) events for a unit that no request of the key named `caller` was served for in
/// `name` (its exposures record the key's name), naming the first such unit; nothing is stored.
async fn only_own_units(
    cp: &ControlPlane,
    name: &str,
    caller: &str,
    events: &[OutcomeEvent],
) -> Result<(), ApiError> {
    let units: BTreeSet<&str> = events.iter().map(|e| e.unit.as_str()).collect();
    let served = cp
        .ab()?
        .store()
        .units_served_to(name, caller, &units)
        .await
        .inspect_err(|_| cp.metrics.store_error("events"))?;
    match units.iter().find(|u| !served.contains(**u)) {
        None => Ok(()),
        Some(u) => Err(ApiError::forbidden_because("not_own_unit", format!(
            "An inference key posts events only for units its own requests were served for: no request of the key '{caller}' was served for unit '{u}' in experiment '{name}' ({} of the {} units in this batch were). Nothing was stored.",
            served.len(),
            units.len()
        ))),
    }
}

#[derive(Deserialize)]
pub struct ResultsQuery {
    analysis: Option<String>,
}

/// Per-variant results: units, exposures, metrics with confidence intervals, SRM check; one
/// observation per unit (`?analysis=request`: the automatic metrics per request, labelled so).
#[utoipa::path(get, path = "/v1/experiments/{name}/results", params(("name" = String, Path, description = "the experiment's name"), ("analysis" = Option<String>, Query, description = "`unit` (default: every metric one value per unit) or `request` (automatic metrics one value per request)")), responses((status = 200, body = abserve_ab::Results)))]
pub async fn results(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
    axum::extract::Query(q): axum::extract::Query<ResultsQuery>,
) -> Result<Response, ApiError> {
    let analysis = match q.analysis.as_deref() {
        None | Some("unit") => abserve_ab::Analysis::Unit,
        Some("request") => abserve_ab::Analysis::Request,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "analysis",
                format!("analysis is `unit` or `request`, not '{other}'"),
            ))
        }
    };
    let ab = cp.ab()?;
    let e = cp.find(&name)?;
    let r = ab.store().results_by(&e, analysis).await?;
    Ok(Json(r).into_response())
}
