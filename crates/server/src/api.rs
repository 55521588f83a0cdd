//! `POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`, non-streamed and
//! streamed as server-sent events exactly as OpenAI sends them.

use std::sync::Arc;

use abserve_engine::prepare::{prepare, Input, Options};
use abserve_protocol::wire::{ChatRequest, Common, CompletionRequest, Model, ModelList};
use abserve_protocol::Sampling;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::body_rules::{
    chat_logprobs, chat_messages, completion_logprobs, completion_prompts, n_choices, PromptInput,
};
use crate::error::ApiError;
use crate::experiments::route;
use crate::respond::{collect_response, now_secs, stream_response};
use crate::state::{AppState, GroupOf};
use crate::valid::{Kind, Routed, ValidRequest};
use crate::validate::parse_openai;

/// The model a request names: its id as answers carry it, and its index (`AppState::model_index`).
fn check_model(state: &AppState, model: &Option<String>) -> Result<(String, usize), ApiError> {
    let Some(m) = model else {
        return Err(ApiError::invalid_param(
            "model",
            "you must provide a model parameter",
        ));
    };
    match state.model_index(m) {
        Some(i) => Ok((state.model_ids()[i].clone(), i)),
        None => Err(ApiError::model_not_found(m)),
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

/// Assigns a request to `experiment:<name>` a variant.
fn route_experiment(
    state: &AppState,
    name: &str,
    common: &Common,
    headers: &HeaderMap,
) -> Result<(abserve_ab::Variant, Routed), ApiError> {
    let unit = |e: &abserve_ab::Experiment| unit_of(e, common, header(headers, "x-abserve-unit"));
    let (e, i, routed) = route(state, name, unit, header(headers, "x-abserve-variant"))?;
    Ok((e.variants[i].clone(), routed))
}

/// The request's sampling settings, OpenAI's two names of `max_tokens` folded into one (the
/// newer wins), and the options of an endpoint whose unset `max_tokens` is `default_max`.
fn request_sampling(c: &Common, default_max: u32, logprobs: Option<u32>) -> (Sampling, Options) {
    let mut sampling = c.sampling.clone();
    let mut options = Options::new(default_max);
    if c.max_completion_tokens.is_some() {
        sampling.max_tokens = c.max_completion_tokens;
        options.max_tokens_field = "max_completion_tokens";
    }
    options.logprobs = logprobs;
    options.ignore_eos = c.ignore_eos;
    options.cache_prompt = c.cache_prompt;
    (sampling, options)
}

fn chat_request(
    state: &AppState,
    body: &[u8],
    headers: &HeaderMap,
) -> Result<ValidRequest, ApiError> {
    let req: ChatRequest = parse_openai(body)?;
    let mut messages = chat_messages(&req)?;
    let n = n_choices(req.common.n)?;
    let (mut sampling, options) = request_sampling(&req.common, u32::MAX, chat_logprobs(&req)?);
    let mut structure = req.common.structure.clone();
    let (model, model_index, routed) = match experiment_name(&req.common.model) {
        Some(name) => {
            let (v, routed) = route_experiment(state, name, &req.common, headers)?;
            (messages, sampling) = v
                .apply(&messages, &sampling)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            structure = structure.overlaid(&v.structure());
            let i = state.variant_model(&v)?;
            (format!("experiment:{name}"), i, Some(routed))
        }
        None => {
            let (id, i) = check_model(state, &req.common.model)?;
            (id, i, None)
        }
    };
    let p = prepare(
        state.engine_at(model_index),
        Input::Chat(&messages),
        &sampling,
        &structure,
        &options,
        state.limits(model_index),
    )?;
    Ok(ValidRequest {
        seqs: vec![p; n],
        model,
        model_index,
        stream: req.common.stream,
        include_usage: req.common.include_usage(),
        return_token_ids: req.common.return_token_ids,
        kind: Kind::Chat,
        routed,
    })
}

fn completion_request(
    state: &AppState,
    body: &[u8],
    headers: &HeaderMap,
) -> Result<ValidRequest, ApiError> {
    let req: CompletionRequest = parse_openai(body)?;
    let n = n_choices(req.common.n)?;
    let (mut model, mut model_index) = (String::new(), 0);
    if experiment_name(&req.common.model).is_none() {
        (model, model_index) = check_model(state, &req.common.model)?;
    }
    let mut prompts = completion_prompts(&req, n, state.engine_at(model_index).n_vocab())?;
    let (mut sampling, options) = request_sampling(&req.common, 16, completion_logprobs(&req)?);
    let mut structure = req.common.structure.clone();
    let routed = match experiment_name(&req.common.model) {
        Some(name) => {
            let (v, routed) = route_experiment(state, name, &req.common, headers)?;
            let [PromptInput::Text(text)] = prompts.as_slice() else {
                return Err(ApiError::invalid_param(
                    "prompt",
                    "experiments take a single text prompt",
                ));
            };
            let text = v
                .completion_prompt(text)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            prompts = vec![PromptInput::Text(text)];
            sampling = sampling.overlaid(&v.sampling());
            structure = structure.overlaid(&v.structure());
            model = format!("experiment:{name}");
            model_index = state.variant_model(&v)?;
            Some(routed)
        }
        None => None,
    };
    let mut seqs = Vec::with_capacity(prompts.len() * n);
    for p in &prompts {
        let p = prepare(
            state.engine_at(model_index),
            p.into(),
            &sampling,
            &structure,
            &options,
            state.limits(model_index),
        )?;
        seqs.extend(std::iter::repeat_n(p, n));
    }
    Ok(ValidRequest {
        seqs,
        model,
        model_index,
        stream: req.common.stream,
        include_usage: req.common.include_usage(),
        return_token_ids: req.common.return_token_ids,
        kind: Kind::Text,
        routed,
    })
}

/// OpenAI's chat completions.
#[utoipa::path(post, path = "/v1/chat/completions", request_body = ChatRequest, responses(
    (status = 200, description = "the answer; with `stream: true`, server-sent `chat.completion.chunk` events ending with `[DONE]`", content((abserve_protocol::wire::Response = "application/json"), (abserve_protocol::abserve::SseEvent = "text/event-stream")))
))]
pub async fn chat(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = match state
        .prepare(move |st| chat_request(st, &body, &headers))
        .await
    {
        Ok(req) => run(state.clone(), req).await,
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
        .prepare(move |st| completion_request(st, &body, &headers))
        .await
    {
        Ok(req) => run(state.clone(), req).await,
        Err(e) => Err(e),
    };
    r.unwrap_or_else(|e| e.into_response())
}

/// Every model served, the default first.
#[utoipa::path(get, path = "/v1/models", responses((status = 200, body = ModelList)))]
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    let created = now_secs();
    let data = state
        .model_ids()
        .into_iter()
        .map(|id| Model {
            id,
            object: "model".into(),
            created,
            owned_by: "abserve".into(),
        })
        .collect();
    Json(ModelList {
        object: "list".into(),
        data,
    })
    .into_response()
}

/// Admits every sequence of the request as one group (all or none: see [`AppState::admit_group`]),
/// then answers.
async fn run(state: Arc<AppState>, mut req: ValidRequest) -> Result<Response, ApiError> {
    let (group, kv_share) = match &req.routed {
        Some(r) => (Some(r.experiment.clone()), r.kv_share),
        None => (None, None),
    };
    let seqs = req
        .seqs
        .iter_mut()
        .map(|p| p.take_request(group.clone(), kv_share))
        .collect();
    let what = match req.kind {
        Kind::Chat => GroupOf::Choices,
        Kind::Text => GroupOf::Completions,
    };
    let rxs = state
        .admit_group(req.model_index, seqs, what)
        .await?
        .into_iter()
        .map(|a| a.rx)
        .collect();
    let routed = req
        .routed
        .as_ref()
        .map(|r| (r.experiment.clone(), r.variant.clone()));
    let mut resp = if req.stream {
        stream_response(state, req, rxs).into_response()
    } else {
        collect_response(state, req, rxs).await?
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
