//! The A/B layer over HTTP: experiment CRUD, assignment of `experiment:<name>` requests,
//! fan-out of one input to every variant, outcome events and results. Storage is SQLite
//! (`abserve_ab::store`); every 2xx that records something was committed before it was sent.

use std::sync::Arc;

use abserve_ab::OutcomeEvent;
use abserve_ab::{Experiment, Status};
use abserve_engine::prepare::{prepare, Input, Options};
use abserve_engine::tools::ToolUse;
use abserve_engine::ChatMessage;
use abserve_engine::Request;
use abserve_protocol::abserve::{Deleted, EventsAccepted, Fanout, FanoutResult, List};
use abserve_protocol::Sampling;
use abserve_statistics::assign;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use crate::abstate::AbState;
use crate::error::ApiError;
use crate::state::{AppState, GroupOf};
use crate::valid::Routed;

fn ab(state: &AppState) -> Result<&AbState, ApiError> {
    state
        .ab
        .as_ref()
        .ok_or_else(|| ApiError::not_found("Experiments are not enabled on this server."))
}

/// The A/B layer and the named experiment, or 404.
pub fn ab_and_experiment<'a>(
    state: &'a AppState,
    name: &str,
) -> Result<(&'a AbState, Experiment), ApiError> {
    Ok((ab(state)?, find(state, name)?))
}

fn find(state: &AppState, name: &str) -> Result<Experiment, ApiError> {
    ab(state)?
        .get(name)
        .ok_or_else(|| ApiError::not_found(format!("No experiment named '{name}'.")))
}

/// An experiment from a request body (JSON, or TOML when the body says `application/toml`: one
/// experiment's table, or a file with one `[[experiment]]`), checked as the API checks requests
/// (every variant as the request it will produce), on the blocking pool: its templates are
/// rendered.
async fn parse_experiment(
    state: &Arc<AppState>,
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
    state
        .prepare(move |st| {
            let e: Experiment = if toml {
                let text = std::str::from_utf8(&body)
                    .map_err(|_| ApiError::bad_request("The TOML body is not UTF-8."))?;
                abserve_ab::parse_one(text).map_err(|e| ApiError::bad_request(e.0))?
            } else {
                crate::validate::parse_body(&body)?
            };
            e.validate().map_err(|e| ApiError::bad_request(e.0))?;
            for v in &e.variants {
                let engine = st.engine_at(st.variant_model(v)?);
                crate::validate::variant(v, engine, engine.plan().context)?;
            }
            Ok(e)
        })
        .await
}

/// Every experiment.
#[utoipa::path(get, path = "/v1/experiments", responses((status = 200, description = "`{object: list, data: [experiment]}`", body = Object)))]
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let ab = ab(&state)?;
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
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ab = ab(&state)?;
    let e = parse_experiment(&state, &headers, body).await?;
    // the store decides (one INSERT that fails on conflict): of two concurrent creates of one
    // name exactly one gets 201
    if !ab
        .store()
        .create_experiment(&e)
        .await
        .inspect_err(|_| state.metrics.store_error("experiment"))?
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
pub async fn get(
    State(state): State<Arc<AppState>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Response, ApiError> {
    Ok(Json(find(&state, &name)?).into_response())
}

/// Replaces an experiment's definition.
#[utoipa::path(put, path = "/v1/experiments/{name}", params(("name" = String, Path, description = "the experiment's name")), request_body = abserve_ab::Experiment, responses((status = 200, body = abserve_ab::Experiment)))]
pub async fn put(
    State(state): State<Arc<AppState>>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ab = ab(&state)?;
    let e = parse_experiment(&state, &headers, body).await?;
    if e.name != name {
        return Err(ApiError::invalid_param(
            "name",
            format!("The body names '{}' but the path names '{name}'.", e.name),
        ));
    }
    ab.store()
        .put_experiment(&e)
        .await
        .inspect_err(|_| state.metrics.store_error("experiment"))?;
    ab.insert(e.clone());
    Ok(Json(e).into_response())
}

/// Deletes an experiment (its exposures and events stay).
#[utoipa::path(delete, path = "/v1/experiments/{name}", params(("name" = String, Path, description = "the experiment's name")), responses((status = 200, body = Deleted)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Response, ApiError> {
    let ab = ab(&state)?;
    find(&state, &name)?;
    ab.store()
        .delete_experiment(&name)
        .await
        .inspect_err(|_| state.metrics.store_error("experiment"))?;
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
/// (a batch id makes a retry idempotent).
#[utoipa::path(post, path = "/v1/experiments/{name}/events", params(("name" = String, Path, description = "the experiment's name")), request_body = Object, responses((status = 200, body = EventsAccepted)))]
pub async fn events(
    State(state): State<Arc<AppState>>,
    UrlPath(name): UrlPath<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ab = ab(&state)?;
    find(&state, &name)?;
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
    let n = events.len();
    let stored = ab
        .store()
        .record_events(&name, batch_id.as_deref(), &events)
        .await
        .inspect_err(|_| state.metrics.store_error("events"))?;
    Ok(Json(EventsAccepted {
        accepted: n,
        stored,
        duplicate_batch: stored == 0,
    })
    .into_response())
}

#[derive(Deserialize)]
pub struct ResultsQuery {
    analysis: Option<String>,
}

/// Per-variant results: units, exposures, metrics with confidence intervals, SRM check; one
/// observation per unit (`?analysis=request`: the automatic metrics per request, labelled so).
#[utoipa::path(get, path = "/v1/experiments/{name}/results", params(("name" = String, Path, description = "the experiment's name"), ("analysis" = Option<String>, Query, description = "`unit` (default: every metric one value per unit) or `request` (automatic metrics one value per request)")), responses((status = 200, body = abserve_ab::Results)))]
pub async fn results(
    State(state): State<Arc<AppState>>,
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
    let ab = ab(&state)?;
    let e = find(&state, &name)?;
    let r = ab.store().results_by(&e, analysis).await?;
    Ok(Json(r).into_response())
}

/// Routes a request for `experiment:<name>`: `unit` reads the request's unit for the experiment
/// (by its `hash_attribute`); `forced` is the variant `X-Abserve-Variant` asks for.
pub fn route(
    state: &AppState,
    name: &str,
    unit: impl FnOnce(&Experiment) -> Option<String>,
    forced: Option<String>,
) -> Result<(Experiment, usize, Routed), ApiError> {
    let e =
        find(state, name).map_err(|_| ApiError::model_not_found(&format!("experiment:{name}")))?;
    let unit = unit(&e);
    let control = e.control_index();
    if let Some(f) = forced {
        let i = e.variants.iter().position(|v| v.id == f).ok_or_else(|| {
            ApiError::invalid_param(
                "X-Abserve-Variant",
                format!("experiment '{name}' has no variant '{f}'"),
            )
        })?;
        let routed = Routed {
            experiment: e.name.clone(),
            variant: f,
            unit,
            forced: true,
            record: true,
            kv_share: e.max_kv_share,
        };
        return Ok((e, i, routed));
    }
    let assigned = match (&unit, e.status) {
        (Some(u), Status::Running) => assign(
            e.seed(),
            u,
            e.variants.len(),
            e.coverage,
            &e.weights(),
            e.hash_version,
        ),
        _ => None,
    };
    let assigned = keep_bandit_unit(state, &e, unit.as_deref(), assigned);
    // a variant stopped by a guardrail takes no units: its bucket is served the control and
    // recorded no more (guardrails.rs)
    let stopped = assigned.is_some_and(|i| e.variants[i].stopped.is_some());
    let i = assigned.filter(|_| !stopped).unwrap_or(control);
    let routed = Routed {
        experiment: e.name.clone(),
        variant: e.variants[i].id.clone(),
        unit,
        forced: false,
        record: assigned.is_some() && !stopped,
        kv_share: e.max_kv_share,
    };
    Ok((e, i, routed))
}

/// A bandit's unit keeps the variant it was first given when the weights change (`assigned` is
/// what hashing with today's weights gives); once a winner is named, every unit gets it.
fn keep_bandit_unit(
    state: &AppState,
    e: &Experiment,
    unit: Option<&str>,
    assigned: Option<usize>,
) -> Option<usize> {
    let (Some(ab), Some(unit), Some(i)) = (state.ab.as_ref(), unit, assigned) else {
        return assigned;
    };
    let settled = e.bandit_state.as_ref().is_some_and(|s| s.winner.is_some());
    if e.bandit_settings().is_none() || settled {
        return assigned;
    }
    if let Some(v) = ab.sticky(&e.name, unit) {
        if let Some(k) = e.variants.iter().position(|x| x.id == v) {
            return Some(k);
        }
    }
    ab.stick(&e.name, unit, &e.variants[i].id);
    Some(i)
}

/// `{input}`: the user message every variant answers.
#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct FanoutBody {
    input: String,
}

/// Runs every variant of an experiment on one input, concurrently, and returns the outputs
/// side by side.
/// Every variant on one input, side by side (queued as one group: all variants or none).
#[utoipa::path(post, path = "/v1/experiments/{name}/fanout", params(("name" = String, Path, description = "the experiment's name")), request_body = FanoutBody, responses((status = 200, body = Fanout)))]
pub async fn fanout(
    State(state): State<Arc<AppState>>,
    UrlPath(name): UrlPath<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let e = find(&state, &name)?;
    let exp = e.clone();
    let (input, requests) = state
        .prepare(move |st| fanout_requests(st, &exp, &body))
        .await?;
    let (requests, tools): (Vec<(usize, Request)>, Vec<Option<ToolUse>>) =
        requests.into_iter().unzip();
    let admitted = admit_by_model(&state, requests).await?;
    let known: Vec<Option<u64>> = admitted.iter().map(|a| a.order).collect();
    let outs =
        futures::future::join_all(admitted.into_iter().map(|a| abserve_engine::collect(a.rx)))
            .await;
    // the order read at admission, else the one collect saw in the stream
    let orders: Vec<u64> = known
        .iter()
        .zip(&outs)
        .map(|(k, o)| {
            k.or_else(|| o.as_ref().ok().and_then(|o| o.admission_order))
                .unwrap_or(u64::MAX)
        })
        .collect();
    let mut results: Vec<FanoutResult> = e
        .variants
        .iter()
        .zip(outs)
        .zip(&tools)
        .map(|((v, o), t)| {
            let mut r = fanout_result(&state, &v.id, o, t.as_ref());
            r.model = v
                .model
                .clone()
                .unwrap_or_else(|| state.config.model_id.clone());
            r
        })
        .collect();
    // admission rank of each variant (0 = admitted first)
    let mut idx: Vec<usize> = (0..orders.len()).collect();
    idx.sort_by_key(|&i| orders[i]);
    for (rank, &i) in idx.iter().enumerate() {
        results[i].admission_rank = rank;
    }
    Ok(Json(Fanout {
        experiment: e.name,
        input,
        results,
    })
    .into_response())
}

/// Admits a fan-out's requests, each on its variant's model: one group per model (all of its
/// variants enter that model's queue, or none do). Variants on several models are admitted
/// model by model; when one model refuses, the receivers already admitted are dropped, which
/// cancels them. The answers come back in the requests' order.
async fn admit_by_model(
    state: &AppState,
    requests: Vec<(usize, Request)>,
) -> Result<Vec<crate::state::Admitted>, ApiError> {
    let n = requests.len();
    let mut by_model: std::collections::BTreeMap<usize, Vec<(usize, Request)>> = Default::default();
    for (pos, (model, r)) in requests.into_iter().enumerate() {
        by_model.entry(model).or_default().push((pos, r));
    }
    let mut slots: Vec<Option<crate::state::Admitted>> = (0..n).map(|_| None).collect();
    for (model, group) in by_model {
        let (positions, reqs): (Vec<usize>, Vec<Request>) = group.into_iter().unzip();
        let admitted = state.admit_group(model, reqs, GroupOf::Variants).await?;
        for (pos, a) in positions.into_iter().zip(admitted) {
            slots[pos] = Some(a);
        }
    }
    Ok(slots.into_iter().flatten().collect())
}

/// The request of every variant of `exp` for a fan-out body, prepared as a chat request routed
/// to that variant would be (an unset `max_tokens` is clamped to the room the context leaves),
/// with the tools its answer is read for.
fn fanout_requests(
    st: &AppState,
    exp: &Experiment,
    body: &[u8],
) -> Result<(String, Vec<((usize, Request), Option<ToolUse>)>), ApiError> {
    let b: FanoutBody = crate::validate::parse_body(body)?;
    let defaults = Sampling {
        temperature: Some(1.0),
        ..Default::default()
    };
    let mut requests = vec![];
    for v in &exp.variants {
        let (msgs, sampling) = v
            .apply(&[ChatMessage::new("user", &b.input)], &defaults)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let model = st.variant_model(v)?;
        let mut p = prepare(
            st.engine_at(model),
            Input::Chat(&msgs),
            &sampling,
            &v.structure(),
            &Options::new(256),
            st.limits(model),
        )?;
        let r = p.take_request(Some(exp.name.clone()), exp.max_kv_share);
        requests.push(((model, r), p.tools));
    }
    Ok((b.input, requests))
}

/// One variant's side of a fan-out: its answer with counts and timings, or its error.
fn fanout_result(
    state: &AppState,
    variant: &str,
    o: Result<abserve_engine::Output, abserve_engine::GenerationError>,
    tools: Option<&ToolUse>,
) -> FanoutResult {
    let mut r = FanoutResult {
        variant: variant.to_string(),
        ..Default::default()
    };
    match o {
        Ok(o) => {
            let d = &o.completion;
            r.output = Some(o.text);
            r.prompt_tokens = Some(d.prompt_tokens as u64);
            r.completion_tokens = Some(d.completion_tokens as u64);
            r.shared_prompt_tokens = Some(d.shared_prompt_tokens as u64);
            r.ttft_ms = Some(d.time_to_first_token.as_secs_f64() * 1e3);
            r.latency_ms = Some(d.total_time.as_secs_f64() * 1e3);
            r.finish_reason = Some(d.finish_reason.as_str().into());
            r.grammar_complete = d.grammar.map(|g| g.complete);
            if let Some(t) = tools {
                let text = r.output.take().unwrap_or_default();
                let (m, finish) = crate::tool_calls::message(t, &text, d.finish_reason.as_str());
                r.output = m.content;
                r.tool_calls = m.tool_calls;
                r.finish_reason = Some(finish);
            }
        }
        Err(err) => {
            state.metrics.generation_error(&err);
            r.error = Some(err.to_string());
        }
    }
    r
}
