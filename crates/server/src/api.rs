//! `POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`, non-streamed and
//! streamed as server-sent events exactly as OpenAI sends them.

use std::sync::Arc;

use abserve_engine::{Request, SamplingParams};
use abserve_protocol::wire::{ChatRequest, Common, CompletionRequest, Model, ModelList, Prompt};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::experiments::{apply_variant, route, variant_messages};
use crate::job::{fit_context, Kind, Routed, ValidRequest};
use crate::respond::{collect_response, now_secs, stream_response};
use crate::state::AppState;
use crate::validate::{completion_logprobs, messages, n, parse_body, sampling, top_logprobs};

fn check_model(state: &AppState, model: &Option<String>) -> Result<String, ApiError> {
    match model {
        None => Err(ApiError::invalid_param(
            "model",
            "you must provide a model parameter",
        )),
        Some(m) if m == &state.config.model_id || m == "default" => {
            Ok(state.config.model_id.clone())
        }
        Some(m) => Err(ApiError::model_not_found(m)),
    }
}

/// `experiment:<name>` models are routed through the A/B layer.
fn experiment_name(model: &Option<String>) -> Option<&str> {
    model.as_deref().and_then(|m| m.strip_prefix("experiment:"))
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .filter(|s| !s.is_empty())
}

/// The unit an experiment assigns by: the request's value of the experiment's `hash_attribute`
/// (GrowthBook's name for it) — `user` is OpenAI's `user` field, any other name a key of
/// OpenAI's `metadata` — else the `X-Abserve-Unit` header.
fn unit_of(e: &abserve_ab::Experiment, common: &Common, header: Option<String>) -> Option<String> {
    let attr = match e.hash_attribute.as_str() {
        "user" => common.user.clone(),
        a => common.metadata.as_ref().and_then(|m| m.get(a).cloned()),
    };
    attr.filter(|s| !s.is_empty()).or(header)
}

/// Assigns a request to `experiment:<name>` a variant and applies the variant's parameters.
fn route_experiment(
    state: &AppState,
    name: &str,
    common: &Common,
    headers: &HeaderMap,
    params: &mut SamplingParams,
    explicit_max: &mut bool,
) -> Result<(abserve_ab::Variant, Routed), ApiError> {
    let unit = |e: &abserve_ab::Experiment| unit_of(e, common, header(headers, "x-abserve-unit"));
    let (e, i, routed) = route(state, name, unit, header(headers, "x-abserve-variant"))?;
    let v = e.variants[i].clone();
    apply_variant(&v, params, explicit_max);
    params
        .validate()
        .map_err(|(p, m)| ApiError::invalid_param(p, m))?;
    Ok((v, routed))
}

fn chat_job(state: &AppState, body: &[u8], headers: &HeaderMap) -> Result<ValidRequest, ApiError> {
    let req: ChatRequest = parse_body(body)?;
    let mut messages = messages(&req)?;
    let n = n(&req.common)?;
    let mut explicit =
        req.common.max_tokens.is_some() || req.common.max_completion_tokens.is_some();
    let mut params = sampling(&req.common, u32::MAX, top_logprobs(&req)?)?;
    let (model, routed) = match experiment_name(&req.common.model) {
        Some(name) => {
            let (v, routed) = route_experiment(
                state,
                name,
                &req.common,
                headers,
                &mut params,
                &mut explicit,
            )?;
            messages = variant_messages(&v, &messages)?;
            (format!("experiment:{name}"), Some(routed))
        }
        None => (check_model(state, &req.common.model)?, None),
    };
    let text = state
        .engine
        .render_chat(&messages)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    // the rendered template carries its own special tokens; do not add BOS twice
    let prompt = state.engine.tokenize(&text, false);
    fit_context(state, &prompt, &mut params, explicit)?;
    Ok(ValidRequest {
        prompts: vec![prompt; n],
        params,
        model,
        stream: req.common.stream,
        include_usage: req.common.include_usage(),
        kind: Kind::Chat,
        routed,
    })
}

fn completion_job(
    state: &AppState,
    body: &[u8],
    headers: &HeaderMap,
) -> Result<ValidRequest, ApiError> {
    let mut req: CompletionRequest = parse_body(body)?;
    if req.echo {
        // it used to be accepted and ignored; a client that asks for its prompt back must know
        return Err(ApiError::invalid_param(
            "echo",
            "echo is not supported; the prompt is not repeated in the answer",
        ));
    }
    let n = n(&req.common)?;
    let mut explicit =
        req.common.max_tokens.is_some() || req.common.max_completion_tokens.is_some();
    let mut params = sampling(&req.common, 16, completion_logprobs(&req)?)?;
    let (model, routed) = match experiment_name(&req.common.model) {
        Some(name) => {
            let (v, routed) = route_experiment(
                state,
                name,
                &req.common,
                headers,
                &mut params,
                &mut explicit,
            )?;
            let text = match &req.prompt {
                Prompt::Text(t) => t.clone(),
                _ => {
                    return Err(ApiError::invalid_param(
                        "prompt",
                        "experiments take a single text prompt",
                    ))
                }
            };
            req.prompt = Prompt::Text(
                v.completion_prompt(&text)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?,
            );
            (format!("experiment:{name}"), Some(routed))
        }
        None => (check_model(state, &req.common.model)?, None),
    };
    let vocab = state.engine.n_vocab() as i64;
    let check_ids = |ids: &[i64]| -> Result<Vec<i32>, ApiError> {
        ids.iter()
            .map(|&t| {
                if (0..vocab).contains(&t) {
                    Ok(t as i32)
                } else {
                    Err(ApiError::invalid_param(
                        "prompt",
                        format!("token id {t} is outside the vocabulary of {vocab}"),
                    ))
                }
            })
            .collect()
    };
    let base: Vec<Vec<i32>> = match &req.prompt {
        Prompt::Text(s) => vec![state.engine.tokenize(s, true)],
        Prompt::Texts(v) if !v.is_empty() => {
            v.iter().map(|s| state.engine.tokenize(s, true)).collect()
        }
        Prompt::Tokens(ids) => vec![check_ids(ids)?],
        Prompt::TokenLists(l) if !l.is_empty() => l
            .iter()
            .map(|ids| check_ids(ids))
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::invalid_param(
                "prompt",
                "prompt must not be an empty list",
            ))
        }
    };
    if base.len() * n > 64 {
        return Err(ApiError::invalid_param(
            "prompt",
            "at most 64 completions per request (prompts × n)",
        ));
    }
    for p in &base {
        fit_context(state, p, &mut params, explicit)?;
    }
    let prompts = base
        .into_iter()
        .flat_map(|p| std::iter::repeat_n(p, n))
        .collect();
    Ok(ValidRequest {
        prompts,
        params,
        model,
        stream: req.common.stream,
        include_usage: req.common.include_usage(),
        kind: Kind::Text,
        routed,
    })
}

/// OpenAI's chat completions.
#[utoipa::path(post, path = "/v1/chat/completions", request_body = ChatRequest, responses(
    (status = 200, description = "the answer; with `stream: true`, server-sent `chat.completion.chunk` events ending with `[DONE]`", content((abserve_protocol::wire::Response = "application/json"), (abserve_protocol::abserve::SseEvent = "text/event-stream")))
))]
pub async fn chat(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = match state.prepare(move |st| chat_job(st, &body, &headers)).await {
        Ok(job) => run(state.clone(), job).await,
        Err(e) => Err(e),
    };
    r.unwrap_or_else(|e| e.into_response())
}

/// OpenAI's (legacy) completions.
#[utoipa::path(post, path = "/v1/completions", request_body = CompletionRequest, responses(
    (status = 200, description = "the answer; with `stream: true`, server-sent `text_completion` events ending with `[DONE]`", content((abserve_protocol::wire::Response = "application/json"), (abserve_protocol::abserve::SseEvent = "text/event-stream")))
))]
pub async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let r = match state
        .prepare(move |st| completion_job(st, &body, &headers))
        .await
    {
        Ok(job) => run(state.clone(), job).await,
        Err(e) => Err(e),
    };
    r.unwrap_or_else(|e| e.into_response())
}

/// The one model served.
#[utoipa::path(get, path = "/v1/models", responses((status = 200, body = ModelList)))]
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    let model = Model {
        id: state.config.model_id.clone(),
        object: "model".into(),
        created: now_secs(),
        owned_by: "abserve".into(),
    };
    Json(ModelList {
        object: "list".into(),
        data: vec![model],
    })
    .into_response()
}

/// Admits every sequence of the job (all or none), then answers.
async fn run(state: Arc<AppState>, job: ValidRequest) -> Result<Response, ApiError> {
    let mut rxs = Vec::with_capacity(job.prompts.len());
    for p in &job.prompts {
        let req = Request {
            prompt: p.clone(),
            params: job.params.clone(),
            group: job.routed.as_ref().map(|r| r.experiment.clone()),
            priority: false,
            kv_share: job.routed.as_ref().and_then(|r| r.kv_share),
        };
        // dropping the receivers already admitted cancels them if a later one is refused
        rxs.push(state.enqueue(req).await?);
    }
    let routed = job
        .routed
        .as_ref()
        .map(|r| (r.experiment.clone(), r.variant.clone()));
    let mut resp = if job.stream {
        stream_response(state, job, rxs).into_response()
    } else {
        collect_response(state, job, rxs).await?
    };
    if let Some((e, v)) = routed {
        let h = resp.headers_mut();
        h.insert(
            "x-abserve-experiment",
            HeaderValue::from_str(&e).unwrap_or(HeaderValue::from_static("?")),
        );
        h.insert(
            "x-abserve-variant",
            HeaderValue::from_str(&v).unwrap_or(HeaderValue::from_static("?")),
        );
    }
    Ok(resp)
}
