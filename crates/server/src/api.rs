//! `POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`, non-streamed and
//! streamed as server-sent events exactly as OpenAI sends them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use abserve_engine::TokenLogprob;
use abserve_engine::{Completion, Event, Request, SamplingParams};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::experiments::{apply_variant, route, variant_messages, Routed};
use crate::openai::{parse_body, ChatRequest, CompletionRequest, PromptField};
use crate::state::AppState;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Text,
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn new_id(prefix: &str) -> String {
    let r: u64 = rand::random();
    format!("{prefix}-{r:016x}")
}

fn check_model(state: &AppState, model: &Option<String>) -> Result<String, ApiError> {
    match model {
        None => Err(ApiError::invalid_param("model", "you must provide a model parameter")),
        Some(m) if m == &state.config.model_id || m == "default" => Ok(state.config.model_id.clone()),
        Some(m) => Err(ApiError::model_not_found(m)),
    }
}

/// Tokenized prompts plus sampling parameters, checked against the context.
struct Job {
    prompts: Vec<Vec<i32>>,
    params: SamplingParams,
    model: String,
    stream: bool,
    include_usage: bool,
    kind: Kind,
    routed: Option<Routed>,
}

/// `experiment:<name>` models are routed through the A/B layer.
fn experiment_name(model: &Option<String>) -> Option<&str> {
    model.as_deref().and_then(|m| m.strip_prefix("experiment:"))
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string).filter(|s| !s.is_empty())
}

pub(crate) fn fit_context(state: &AppState, prompt: &[i32], params: &mut SamplingParams, explicit_max: bool) -> Result<(), ApiError> {
    let ctx = state.engine.plan().context as usize;
    let limit = state.config.max_prompt_tokens.min(ctx - 1);
    if prompt.is_empty() {
        return Err(ApiError::invalid_param("prompt", "The prompt is empty."));
    }
    if prompt.len() > limit {
        return Err(ApiError::invalid_param(
            "messages",
            format!(
                "This model's maximum context length is {ctx} tokens and prompts may have at most {limit} tokens; your prompt has {} tokens.",
                prompt.len()
            ),
        ));
    }
    let room = ctx - prompt.len();
    if !explicit_max {
        params.max_tokens = params.max_tokens.min(room as u32);
    } else if params.max_tokens as usize > room {
        return Err(ApiError::invalid_param(
            "max_tokens",
            format!(
                "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({} in the prompt, {} for the completion). Reduce the prompt or max_tokens.",
                prompt.len() + params.max_tokens as usize,
                prompt.len(),
                params.max_tokens
            ),
        ));
    }
    Ok(())
}

/// Assigns a request to `experiment:<name>` a variant and applies the variant's parameters.
fn route_experiment(
    state: &AppState,
    name: &str,
    common: &crate::openai::Common,
    headers: &HeaderMap,
    params: &mut SamplingParams,
    explicit_max: &mut bool,
) -> Result<(abserve_ab::Variant, Routed), ApiError> {
    let unit = common.user.clone().or_else(|| header(headers, "x-abserve-unit"));
    let (e, i, routed) = route(state, name, unit, header(headers, "x-abserve-variant"))?;
    let v = e.variants[i].clone();
    apply_variant(&v, params, explicit_max);
    params.validate().map_err(|(p, m)| ApiError::invalid_param(p, m))?;
    Ok((v, routed))
}

fn chat_job(state: &AppState, body: &[u8], headers: &HeaderMap) -> Result<Job, ApiError> {
    let req: ChatRequest = parse_body(body)?;
    let mut messages = req.messages()?;
    let n = req.common.n()?;
    let mut explicit = req.common.max_tokens.is_some() || req.common.max_completion_tokens.is_some();
    let mut params = req.common.sampling(u32::MAX, req.top_logprobs()?)?;
    let (model, routed) = match experiment_name(&req.common.model) {
        Some(name) => {
            let (v, routed) = route_experiment(state, name, &req.common, headers, &mut params, &mut explicit)?;
            messages = variant_messages(&v, &messages)?;
            (format!("experiment:{name}"), Some(routed))
        }
        None => (check_model(state, &req.common.model)?, None),
    };
    let text = state.engine.render_chat(&messages).map_err(|e| ApiError::bad_request(e.to_string()))?;
    // the rendered template carries its own special tokens; do not add BOS twice
    let prompt = state.engine.model().tokenize(&text, false);
    fit_context(state, &prompt, &mut params, explicit)?;
    Ok(Job {
        prompts: vec![prompt; n],
        params,
        model,
        stream: req.common.stream,
        include_usage: req.common.include_usage(),
        kind: Kind::Chat,
        routed,
    })
}

fn completion_job(state: &AppState, body: &[u8], headers: &HeaderMap) -> Result<Job, ApiError> {
    let mut req: CompletionRequest = parse_body(body)?;
    if req.echo {
        // it used to be accepted and ignored; a client that asks for its prompt back must know
        return Err(ApiError::invalid_param("echo", "echo is not supported; the prompt is not repeated in the answer"));
    }
    let n = req.common.n()?;
    let mut explicit = req.common.max_tokens.is_some() || req.common.max_completion_tokens.is_some();
    let mut params = req.common.sampling(16, req.logprobs()?)?;
    let (model, routed) = match experiment_name(&req.common.model) {
        Some(name) => {
            let (v, routed) = route_experiment(state, name, &req.common, headers, &mut params, &mut explicit)?;
            let text = match &req.prompt {
                PromptField::Text(t) => t.clone(),
                _ => return Err(ApiError::invalid_param("prompt", "experiments take a single text prompt")),
            };
            req.prompt = PromptField::Text(v.completion_prompt(&text).map_err(|e| ApiError::bad_request(e.to_string()))?);
            (format!("experiment:{name}"), Some(routed))
        }
        None => (check_model(state, &req.common.model)?, None),
    };
    let vocab = state.engine.model().n_vocab() as i64;
    let check_ids = |ids: &[i64]| -> Result<Vec<i32>, ApiError> {
        ids.iter()
            .map(|&t| {
                if (0..vocab).contains(&t) {
                    Ok(t as i32)
                } else {
                    Err(ApiError::invalid_param("prompt", format!("token id {t} is outside the vocabulary of {vocab}")))
                }
            })
            .collect()
    };
    let base: Vec<Vec<i32>> = match &req.prompt {
        PromptField::Text(s) => vec![state.engine.tokenize(s)],
        PromptField::Texts(v) if !v.is_empty() => v.iter().map(|s| state.engine.tokenize(s)).collect(),
        PromptField::Tokens(ids) => vec![check_ids(ids)?],
        PromptField::TokenLists(l) if !l.is_empty() => l.iter().map(|ids| check_ids(ids)).collect::<Result<_, _>>()?,
        _ => return Err(ApiError::invalid_param("prompt", "prompt must not be an empty list")),
    };
    if base.len() * n > 64 {
        return Err(ApiError::invalid_param("prompt", "at most 64 completions per request (prompts × n)"));
    }
    for p in &base {
        fit_context(state, p, &mut params, explicit)?;
    }
    let prompts = base.into_iter().flat_map(|p| std::iter::repeat_n(p, n)).collect();
    Ok(Job {
        prompts,
        params,
        model,
        stream: req.common.stream,
        include_usage: req.common.include_usage(),
        kind: Kind::Text,
        routed,
    })
}

pub async fn chat(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = match chat_job(&state, &body, &headers) {
        Ok(job) => run(state.clone(), job).await,
        Err(e) => Err(e),
    };
    finish(&state, "chat_completions", r)
}

pub async fn completions(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = match completion_job(&state, &body, &headers) {
        Ok(job) => run(state.clone(), job).await,
        Err(e) => Err(e),
    };
    finish(&state, "completions", r)
}

fn finish(state: &AppState, endpoint: &str, r: Result<Response, ApiError>) -> Response {
    let resp = r.unwrap_or_else(|e| e.into_response());
    state.metrics.count(endpoint, resp.status().as_u16());
    resp
}

pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    state.metrics.count("models", 200);
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model_id,
            "object": "model",
            "created": now_secs(),
            "owned_by": "abserve",
        }]
    }))
    .into_response()
}

/// Admits every sequence of the job (all or none), then answers.
async fn run(state: Arc<AppState>, job: Job) -> Result<Response, ApiError> {
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
    let routed = job.routed.as_ref().map(|r| (r.experiment.clone(), r.variant.clone()));
    let mut resp = if job.stream {
        stream_response(state, job, rxs).into_response()
    } else {
        collect_response(state, job, rxs).await?
    };
    if let Some((e, v)) = routed {
        let h = resp.headers_mut();
        h.insert("x-abserve-experiment", HeaderValue::from_str(&e).unwrap_or(HeaderValue::from_static("?")));
        h.insert("x-abserve-variant", HeaderValue::from_str(&v).unwrap_or(HeaderValue::from_static("?")));
    }
    Ok(resp)
}

/// Records the exposure of a routed request (committed before the response goes out).
async fn expose(state: &AppState, routed: &Routed, d: Option<&Completion>, error: Option<String>) -> Result<(), ApiError> {
    let (Some(ab), true) = (state.ab.as_ref(), routed.record) else { return Ok(()) };
    let x = abserve_ab::Exposure {
        variant: routed.variant.clone(),
        unit: routed.unit.clone().unwrap_or_default(),
        forced: routed.forced,
        latency_ms: d.map(|d| d.total_time.as_secs_f64() * 1e3),
        ttft_ms: d.map(|d| d.time_to_first_token.as_secs_f64() * 1e3),
        output_tokens: d.map(|d| d.completion_tokens as u64),
        error,
    };
    ab.record_exposure(routed.experiment.clone(), x).await
}

fn abserve_field(r: &Routed) -> Value {
    json!({"experiment": r.experiment, "variant": r.variant, "unit": r.unit, "forced": r.forced, "in_experiment": r.record})
}

fn observe(state: &AppState, d: &Completion) {
    state.metrics.ttft.observe(d.time_to_first_token.as_secs_f64());
    state.metrics.request_duration.observe(d.total_time.as_secs_f64());
    if d.completion_tokens > 1 {
        let per = (d.total_time - d.time_to_first_token).as_secs_f64() / (d.completion_tokens - 1) as f64;
        state.metrics.time_per_output_token.observe(per);
    }
}

fn chat_logprobs(state: &AppState, lps: &[TokenLogprob]) -> Value {
    let m = state.engine.model();
    let entry = |t: i32, lp: f32| {
        let bytes = m.piece(t);
        json!({"token": String::from_utf8_lossy(&bytes), "logprob": lp, "bytes": bytes})
    };
    json!({"content": lps.iter().map(|l| {
        let mut e = entry(l.token, l.logprob);
        e["top_logprobs"] = Value::Array(l.top.iter().map(|&(t, lp)| entry(t, lp)).collect());
        e
    }).collect::<Vec<_>>()})
}

fn text_logprobs(state: &AppState, lps: &[TokenLogprob]) -> Value {
    let m = state.engine.model();
    let mut offset = 0usize;
    let mut tokens = vec![];
    let mut token_logprobs = vec![];
    let mut top = vec![];
    let mut offsets = vec![];
    for l in lps {
        let t = m.token_text(l.token);
        offsets.push(offset);
        offset += t.len();
        tokens.push(t);
        token_logprobs.push(l.logprob);
        let map: serde_json::Map<String, Value> = l.top.iter().map(|&(t, lp)| (m.token_text(t), json!(lp))).collect();
        top.push(Value::Object(map));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

async fn collect_response(
    state: Arc<AppState>,
    job: Job,
    rxs: Vec<UnboundedReceiver<Event>>,
) -> Result<Response, ApiError> {
    let results = futures::future::join_all(rxs.into_iter().map(abserve_engine::collect)).await;
    if let Some(r) = &job.routed {
        let first = results.first().and_then(|x| x.as_ref().ok()).map(|c| &c.completion);
        let err = results.iter().find_map(|x| x.as_ref().err()).map(|e| e.to_string());
        expose(&state, r, first, err).await?;
    }
    let mut choices = vec![];
    let prompt_tokens = prompt_tokens_once(&job.prompts);
    let (mut completion_tokens, mut cached) = (0, 0);
    for (i, r) in results.into_iter().enumerate() {
        let c = r.map_err(|e| ApiError::unavailable(e.to_string()))?;
        let d = c.completion;
        observe(&state, &d);
        cached += d.shared_prompt_tokens;
        completion_tokens += d.completion_tokens;
        let want_lp = job.params.logprobs.is_some();
        let choice = match job.kind {
            Kind::Chat => json!({
                "index": i,
                "message": {"role": "assistant", "content": c.text, "refusal": null},
                "logprobs": if want_lp { chat_logprobs(&state, &c.logprobs) } else { Value::Null },
                "finish_reason": d.finish_reason.as_str(),
            }),
            Kind::Text => json!({
                "index": i,
                "text": c.text,
                "logprobs": if want_lp { text_logprobs(&state, &c.logprobs) } else { Value::Null },
                "finish_reason": d.finish_reason.as_str(),
            }),
        };
        choices.push(choice);
    }
    let (id, object) = match job.kind {
        Kind::Chat => (new_id("chatcmpl"), "chat.completion"),
        Kind::Text => (new_id("cmpl"), "text_completion"),
    };
    let mut body = json!({
        "id": id,
        "object": object,
        "created": now_secs(),
        "model": job.model,
        "system_fingerprint": "abserve",
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    });
    if let Some(r) = &job.routed {
        body["abserve"] = abserve_field(r);
    }
    Ok(Json(body).into_response())
}

/// Builds the chunks of one streamed response (id, model and object are fixed for all).
#[derive(Clone)]
struct Chunker {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    kind: Kind,
    want_lp: bool,
    state: Arc<AppState>,
}

impl Chunker {
    fn chunk(&self, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object, "created": self.created, "model": self.model, "system_fingerprint": "abserve", "choices": choices})
    }

    /// The chunk an engine event of choice `i` becomes (none for admission and empty tokens).
    fn piece(&self, i: usize, ev: Event) -> Option<Piece> {
        match ev {
            Event::Token { text, logprob, .. } => {
                if text.is_empty() && logprob.is_none() {
                    return None;
                }
                let lp = if self.want_lp {
                    let l: Vec<TokenLogprob> = logprob.into_iter().collect();
                    match self.kind {
                        Kind::Chat => chat_logprobs(&self.state, &l),
                        Kind::Text => text_logprobs(&self.state, &l),
                    }
                } else {
                    Value::Null
                };
                Some(Piece::Chunk(match self.kind {
                    Kind::Chat => self.chunk(json!([{"index": i, "delta": {"content": text}, "logprobs": lp, "finish_reason": null}])),
                    Kind::Text => self.chunk(json!([{"index": i, "text": text, "logprobs": lp, "finish_reason": null}])),
                }))
            }
            Event::Done(d) => {
                observe(&self.state, &d);
                let delta = if d.tail_text.is_empty() { json!({}) } else { json!({"content": d.tail_text}) };
                let c = match self.kind {
                    Kind::Chat => self.chunk(json!([{"index": i, "delta": delta, "logprobs": null, "finish_reason": d.finish_reason.as_str()}])),
                    Kind::Text => self.chunk(json!([{"index": i, "text": d.tail_text, "logprobs": null, "finish_reason": d.finish_reason.as_str()}])),
                };
                Some(Piece::Last(c, d))
            }
            Event::Error(e) => {
                let message = e.to_string();
                Some(Piece::Error(json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}}), message))
            }
            Event::Admitted { .. } => None,
        }
    }
}

/// What a streamed response has seen, for its exposure and its usage chunk: the first choice's
/// completion and the first error (as a whole response records them), and the tokens.
#[derive(Default)]
struct Seen {
    first_done: Option<Completion>,
    first_error: Option<String>,
    completion_tokens: usize,
}

/// Merges the per-choice event streams into OpenAI's chunk sequence.
fn stream_response(
    state: Arc<AppState>,
    job: Job,
    rxs: Vec<UnboundedReceiver<Event>>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let (id, object) = match job.kind {
        Kind::Chat => (new_id("chatcmpl"), "chat.completion.chunk"),
        Kind::Text => (new_id("cmpl"), "text_completion"),
    };
    let chunker = Chunker {
        id,
        object,
        created: now_secs(),
        model: job.model.clone(),
        kind: job.kind,
        want_lp: job.params.logprobs.is_some(),
        state: state.clone(),
    };
    // role chunks first (chat only)
    let head: Vec<Value> = match job.kind {
        Kind::Chat => (0..rxs.len())
            .map(|i| chunker.chunk(json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}])))
            .collect(),
        Kind::Text => vec![],
    };
    let merged = stream::select_all(rxs.into_iter().enumerate().map(|(i, rx)| {
        stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) }).map(move |ev| (i, ev)).boxed()
    }));
    let seen: Arc<std::sync::Mutex<Seen>> = Default::default();
    let body = {
        let (chunker, seen) = (chunker.clone(), seen.clone());
        merged.filter_map(move |(i, ev)| std::future::ready(chunker.piece(i, ev))).map(move |p| {
            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
            match p {
                Piece::Chunk(c) => sse(&c),
                Piece::Error(c, message) => {
                    s.first_error.get_or_insert(message);
                    sse(&c)
                }
                Piece::Last(c, d) => {
                    s.completion_tokens += d.completion_tokens;
                    s.first_done.get_or_insert(d);
                    sse(&c)
                }
            }
        })
    };
    let tail = stream::once(finish_stream(state, job, chunker, seen)).filter_map(|x| async move { x });
    let events = stream::iter(head.into_iter().map(|c| sse(&c)))
        .chain(body)
        .chain(tail)
        .chain(stream::once(async { Ok(SseEvent::default().data("[DONE]")) }));
    Sse::new(events)
}

/// After the last choice ended: records the exposure, then gives the usage chunk if asked for.
async fn finish_stream(state: Arc<AppState>, job: Job, chunker: Chunker, seen: Arc<std::sync::Mutex<Seen>>) -> Option<Result<SseEvent, Infallible>> {
    let (done, err, completion) = {
        let s = seen.lock().unwrap_or_else(|p| p.into_inner());
        (s.first_done.clone(), s.first_error.clone(), s.completion_tokens)
    };
    if let Some(r) = &job.routed {
        if let Err(e) = expose(&state, r, done.as_ref(), err).await {
            tracing::error!("recording an exposure failed: {}", e.message);
        }
    }
    if !job.include_usage {
        return None;
    }
    let prompt_tokens = prompt_tokens_once(&job.prompts);
    let mut c = chunker.chunk(json!([]));
    c["usage"] = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion});
    Some(sse(&c))
}

enum Piece {
    Chunk(Value),
    /// An error chunk and its message.
    Error(Value, String),
    Last(Value, Completion),
}

/// Prompt tokens as OpenAI counts them: the `n` copies of one prompt count once.
fn prompt_tokens_once(prompts: &[Vec<i32>]) -> usize {
    prompts.iter().enumerate().filter(|(i, p)| *i == 0 || prompts[i - 1] != **p).map(|(_, p)| p.len()).sum()
}

fn sse(v: &Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().data(v.to_string()))
}
