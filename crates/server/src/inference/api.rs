//! `POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`, non-streamed and
//! streamed as server-sent events exactly as OpenAI sends them.

use std::sync::Arc;

use abserve_ab::{Asked, Prompt};
use abserve_engine::prepare::{Input, Options};
use abserve_engine::{Class, Placement};
use abserve_protocol::wire::{ChatRequest, Common, CompletionRequest, Model, ModelList};
use abserve_protocol::Sampling;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::admission::{admit_group, GroupOf};
use super::body_rules::{
    chat_logprobs, chat_messages, completion_logprobs, completion_prompts, n_choices, parse_openai,
    placement_of, PromptInput,
};
use super::request::{Kind, ValidRequest};
use super::respond::{collect_response, now_secs};
use super::stream::stream_response;
use crate::error::ApiError;
use crate::experiments::Routed;
use crate::keys::Caller;
use crate::state::AppState;

/// The model a request names: its id as answers carry it, and its position in the registry.
fn check_model(state: &AppState, model: &Option<String>) -> Result<(String, usize), ApiError> {
    let Some(m) = model else {
        return Err(ApiError::invalid_param(
            "model",
            "you must provide a model parameter",
        ));
    };
    match state.models.index(m) {
        Some(i) => Ok((state.models.at(i).id.clone(), i)),
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
    let (e, i, routed) =
        state
            .experiments
            .route(name, unit, header(headers, "x-abserve-variant"))?;
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

/// Where a request goes and what it asks there: the model it names, as the client sent it, or
/// for `experiment:NAME` the routed variant's model with the variant applied (the one
/// application for chat, completions and fan-out: `Variant::apply`). Answers the request as
/// it will run, the model's id as answers carry it, its position in the registry, and the
/// routing.
fn resolve(
    state: &AppState,
    common: &Common,
    headers: &HeaderMap,
    asked: Asked,
) -> Result<(Asked, String, usize, Option<Routed>), ApiError> {
    match experiment_name(&common.model) {
        Some(name) => {
            let (v, routed) = route_experiment(state, name, common, headers)?;
            let asked = v
                .apply(asked)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            let i = state.experiments.variant_model(&v)?;
            Ok((asked, format!("experiment:{name}"), i, Some(routed)))
        }
        None => {
            let (id, i) = check_model(state, &common.model)?;
            Ok((asked, id, i, None))
        }
    }
}

/// The request's priority class and `priority`: its own `service_tier` and `priority`, else its
/// key's class (`--keys`), else its experiment's class, else interactive (the OpenAI routes'
/// default).
fn classify(
    common: &Common,
    caller: Option<&Caller>,
    routed: Option<&Routed>,
) -> Result<(Class, i32), ApiError> {
    let default = caller
        .and_then(|c| c.class)
        .or_else(|| routed.and_then(|r| r.tier))
        .unwrap_or_default();
    Ok(placement_of(
        common.service_tier.as_deref(),
        common.priority,
        default,
    )?)
}

/// Gives a routed request its answer's id, its key's name and, when its unit is sampled, what
/// it asks the model (after the variant) and its `input` as the client sent it (the last user
/// message, or the completions prompt: what an eval replays), for its exposure and sample.
fn note_routed(
    routed: &mut Option<Routed>,
    (id, caller): (&str, Option<&Caller>),
    (input, asked): (&str, &Asked),
    model_id: &str,
) {
    if let Some(r) = routed {
        r.request_id = id.to_string();
        r.caller = caller.map(|c| c.name.clone());
        if r.sampled.is_some() {
            let mut v = abserve_ab::asked_json(asked, model_id);
            v["input"] = serde_json::Value::String(input.to_string());
            r.asked = Some(v);
        }
    }
}

fn chat_request(
    state: &AppState,
    body: &[u8],
    headers: &HeaderMap,
    caller: Option<&Caller>,
) -> Result<ValidRequest, ApiError> {
    let req: ChatRequest = parse_openai(body)?;
    let messages = chat_messages(&req)?;
    // the last user message as the client sent it (a sampled request's `input`)
    let input = messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .map(|m| m.content.clone())
        .unwrap_or_default();
    let n = n_choices(req.common.n)?;
    let (sampling, options) = request_sampling(&req.common, u32::MAX, chat_logprobs(&req)?);
    let asked = Asked {
        prompt: Prompt::Chat(messages),
        sampling,
        structure: req.common.structure.clone(),
    };
    let (asked, model, model_index, mut routed) = resolve(state, &req.common, headers, asked)?;
    let (class, priority) = classify(&req.common, caller, routed.as_ref())?;
    let id = Kind::Chat.id();
    note_routed(
        &mut routed,
        (&id, caller),
        (&input, &asked),
        &state.models.at(model_index).id,
    );
    let Prompt::Chat(messages) = &asked.prompt else {
        return Err(ApiError::internal(
            "a variant turned a conversation into text",
        ));
    };
    let p = state.models.at(model_index).prepare(
        Input::Chat(messages),
        &asked.sampling,
        &asked.structure,
        &options,
        state.config.max_prompt_tokens,
    )?;
    Ok(ValidRequest {
        id,
        seqs: vec![p; n],
        n,
        model,
        model_index,
        stream: req.common.stream,
        include_usage: req.common.include_usage(),
        return_token_ids: req.common.return_token_ids,
        kind: Kind::Chat,
        routed,
        class,
        priority,
    })
}

fn completion_request(
    state: &AppState,
    body: &[u8],
    headers: &HeaderMap,
    caller: Option<&Caller>,
) -> Result<ValidRequest, ApiError> {
    let req: CompletionRequest = parse_openai(body)?;
    let n = n_choices(req.common.n)?;
    let experiment = experiment_name(&req.common.model).is_some();
    // token ids are checked against the vocabulary of the model named (an experiment's
    // variants take text only)
    let vocab_of = match experiment {
        true => 0,
        false => check_model(state, &req.common.model)?.1,
    };
    let n_vocab = state.models.at(vocab_of).tokens().map(|t| t.n_vocab());
    let mut prompts = completion_prompts(&req, n, n_vocab)?;
    let (sampling, options) = request_sampling(&req.common, 16, completion_logprobs(&req)?);
    let first = match prompts.as_slice() {
        [PromptInput::Text(text)] => text.clone(),
        _ if experiment => {
            return Err(ApiError::invalid_param(
                "prompt",
                "experiments take a single text prompt",
            ))
        }
        _ => String::new(),
    };
    let asked = Asked {
        prompt: Prompt::Text(first.clone()),
        sampling,
        structure: req.common.structure.clone(),
    };
    let (asked, model, model_index, mut routed) = resolve(state, &req.common, headers, asked)?;
    let (class, priority) = classify(&req.common, caller, routed.as_ref())?;
    let id = Kind::Text.id();
    note_routed(
        &mut routed,
        (&id, caller),
        (&first, &asked),
        &state.models.at(model_index).id,
    );
    if let (Some(_), Prompt::Text(text)) = (&routed, &asked.prompt) {
        prompts = vec![PromptInput::Text(text.clone())];
    }
    let mut seqs = Vec::with_capacity(prompts.len() * n);
    for p in &prompts {
        let p = state.models.at(model_index).prepare(
            p.into(),
            &asked.sampling,
            &asked.structure,
            &options,
            state.config.max_prompt_tokens,
        )?;
        seqs.extend(std::iter::repeat_n(p, n));
    }
    Ok(ValidRequest {
        id,
        seqs,
        n,
        model,
        model_index,
        stream: req.common.stream,
        include_usage: req.common.include_usage(),
        return_token_ids: req.common.return_token_ids,
        kind: Kind::Text,
        routed,
        class,
        priority,
    })
}

/// OpenAI's chat completions.
#[utoipa::path(post, path = "/v1/chat/completions", request_body = ChatRequest, responses(
    (status = 200, description = "the answer; with `stream: true`, server-sent `chat.completion.chunk` events ending with `[DONE]`", content((abserve_protocol::wire::Response = "application/json"), (abserve_protocol::abserve::SseEvent = "text/event-stream")))
))]
pub async fn chat(
    State(state): State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = caller.map(|c| c.0);
    let r = match state
        .off_thread(move |st| chat_request(st, &body, &headers, caller.as_ref()))
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
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = caller.map(|c| c.0);
    let r = match state
        .off_thread(move |st| completion_request(st, &body, &headers, caller.as_ref()))
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
        .models
        .iter()
        .map(|m| Model {
            id: m.id.clone(),
            object: "model".into(),
            created,
            owned_by: m.owned_by().into(),
        })
        .collect();
    Json(ModelList {
        object: "list".into(),
        data,
    })
    .into_response()
}

/// Admits every sequence of the request as one group (all or none: see [`admit_group`]),
/// then answers.
async fn run(state: Arc<AppState>, req: ValidRequest) -> Result<Response, ApiError> {
    let at = Placement {
        group: req.routed.as_ref().map(|r| r.experiment.clone()),
        kv_share: req.routed.as_ref().and_then(|r| r.kv_share),
        class: req.class,
        priority: req.priority,
    };
    let what = match req.kind {
        Kind::Chat => GroupOf::Choices,
        Kind::Text => GroupOf::Completions,
    };
    let rxs = admit_group(&state, req.model_index, req.seqs.clone(), at, what)
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
