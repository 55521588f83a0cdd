//! Answers in OpenAI's shapes (`abserve_protocol::wire`): a whole response once every choice
//! finished, or a stream of chunks as server-sent events, exactly as OpenAI sends them (a role
//! chunk per choice for chat, content chunks, a finish chunk per choice, the usage chunk when
//! asked for, `[DONE]`). Both record the exposure of a routed request with the same fields: the
//! first choice's completion and the first error.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use abserve_engine::{Class, Completion, Event, TokenLogprob};
use abserve_protocol::wire::{
    ChatLogprobs, Choice, Chunk, ChunkChoice, Delta, ErrorBody, ErrorObject, Logprobs,
    PromptTokensDetails, Response as WireResponse, ResponseMessage, Routing, TextLogprobs,
    TokenLogprob as WireLogprob, TopLogprob, Usage,
};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, Stream, StreamExt};
use tokio::sync::mpsc::UnboundedReceiver;

use super::request::{Kind, ValidRequest};
use super::tool_calls::Streamed;
use crate::error::ApiError;
use crate::experiments::Routed;
use crate::state::AppState;

impl Kind {
    fn id(self) -> String {
        let r: u64 = rand::random();
        match self {
            Kind::Chat => format!("chatcmpl-{r:016x}"),
            Kind::Text => format!("cmpl-{r:016x}"),
        }
    }
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn routing(r: &Routed) -> Routing {
    Routing {
        experiment: r.experiment.clone(),
        variant: r.variant.clone(),
        unit: r.unit.clone(),
        forced: r.forced,
        in_experiment: r.record,
    }
}

/// Observes a finished answer's latencies (and its time to first token in its class's series).
pub(crate) fn observe(state: &AppState, class: Class, d: &Completion) {
    let ttft = d.time_to_first_token.as_secs_f64();
    state.metrics.ttft.observe(ttft);
    state
        .metrics
        .class_ttft
        .with_label_values(&[class.as_str()])
        .observe(ttft);
    state
        .metrics
        .request_duration
        .observe(d.total_time.as_secs_f64());
    if d.completion_tokens > 1 {
        let per =
            (d.total_time - d.time_to_first_token).as_secs_f64() / (d.completion_tokens - 1) as f64;
        state.metrics.time_per_output_token.observe(per);
    }
}

/// Log-probabilities in the endpoint's shape (none from a model that gives no token ids).
fn logprobs(state: &AppState, model: usize, kind: Kind, lps: &[TokenLogprob]) -> Option<Logprobs> {
    let e = state.models.at(model).tokens()?;
    Some(match kind {
        Kind::Chat => {
            let top = |t: i32, logprob: f32| {
                let bytes = e.piece(t);
                TopLogprob {
                    token: String::from_utf8_lossy(&bytes).into_owned(),
                    logprob,
                    bytes,
                }
            };
            let content = lps
                .iter()
                .map(|l| {
                    let TopLogprob {
                        token,
                        logprob,
                        bytes,
                    } = top(l.token, l.logprob);
                    let top_logprobs = l.top.iter().map(|&(t, lp)| top(t, lp)).collect();
                    WireLogprob {
                        token,
                        logprob,
                        bytes,
                        top_logprobs,
                    }
                })
                .collect();
            Logprobs::Chat(ChatLogprobs { content })
        }
        Kind::Text => {
            let mut out = TextLogprobs::default();
            let mut offset = 0usize;
            for l in lps {
                let t = e.token_text(l.token);
                out.text_offset.push(offset);
                offset += t.len();
                out.tokens.push(t);
                out.token_logprobs.push(l.logprob);
                out.top_logprobs
                    .push(l.top.iter().map(|&(t, lp)| (e.token_text(t), lp)).collect());
            }
            Logprobs::Text(out)
        }
    })
}

/// What the finished choices of an answer used, whole or streamed alike.
#[derive(Default, Clone)]
struct Tally {
    completion_tokens: usize,
    /// Prompt tokens of every choice whose KV came from a cached prefix.
    cached_tokens: usize,
    /// Each choice's prompt tokens as its model counted them (known once it finished).
    prompt_tokens: Vec<Option<usize>>,
}

impl Tally {
    /// Choice `i` finished with `d`.
    fn add(&mut self, i: usize, d: &Completion) {
        self.completion_tokens += d.completion_tokens;
        self.cached_tokens += d.shared_prompt_tokens;
        if self.prompt_tokens.len() <= i {
            self.prompt_tokens.resize(i + 1, None);
        }
        self.prompt_tokens[i] = Some(d.prompt_tokens);
    }

    /// The usage OpenAI reports: prompt tokens with the `n` copies of one prompt counted once
    /// (tokens counted here, or by the model for a prompt it tokenized elsewhere), the
    /// completion tokens of every choice, and how many prompt tokens came from cached prefixes
    /// (`cached_tokens`).
    fn usage(&self, req: &ValidRequest) -> Usage {
        let prompt: usize = (0..req.seqs.len())
            .step_by(req.n.max(1))
            .map(|i| match req.seqs[i].prompt.len() {
                0 => self.prompt_tokens.get(i).copied().flatten().unwrap_or(0),
                n => n,
            })
            .sum();
        let mut usage = Usage::new(prompt as u64, self.completion_tokens as u64);
        usage.prompt_tokens_details = Some(PromptTokensDetails {
            cached_tokens: self.cached_tokens as u64,
        });
        usage
    }
}

/// Puts choice `i`'s text where its endpoint carries it, read for tool calls when the request
/// has tools, with its finish reason.
fn answer(choice: &mut Choice, req: &ValidRequest, i: usize, text: String, finish: &str) {
    choice.finish_reason = Some(finish.to_string());
    match (req.kind, &req.seqs[i].tools) {
        (Kind::Chat, Some(tools)) => {
            let (m, finish) = super::tool_calls::message(tools, &text, finish);
            choice.message = Some(m);
            choice.finish_reason = Some(finish);
        }
        (Kind::Chat, None) => {
            choice.message = Some(ResponseMessage {
                role: "assistant".into(),
                content: Some(text),
                tool_calls: None,
            })
        }
        (Kind::Text, _) => choice.text = Some(text),
    }
}

/// Waits for every choice, records the exposure, then answers with one JSON body.
pub(crate) async fn collect_response(
    state: Arc<AppState>,
    req: ValidRequest,
    rxs: Vec<UnboundedReceiver<Event>>,
) -> Result<Response, ApiError> {
    let results = futures::future::join_all(rxs.into_iter().map(abserve_engine::collect)).await;
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        state.metrics.generation_error(e);
    }
    // an exposure the store cannot write does not cost the client its answer: the answer says
    // it is not in the experiment's results (and the log and /metrics say why)
    let mut recorded = true;
    if let Some(r) = &req.routed {
        let first = results
            .first()
            .and_then(|x| x.as_ref().ok())
            .map(|c| &c.completion);
        let err = results
            .iter()
            .find_map(|x| x.as_ref().err())
            .map(|e| e.to_string());
        recorded = state.experiments.record(r, first, err).await.is_ok();
    }
    let want_lp = req.logprobs();
    let (mut choices, mut tally) = (vec![], Tally::default());
    for (i, r) in results.into_iter().enumerate() {
        let c = r.map_err(ApiError::generation)?;
        let d = c.completion;
        observe(&state, req.class, &d);
        tally.add(i, &d);
        let mut choice = Choice {
            index: i as u32,
            logprobs: want_lp
                .then(|| logprobs(&state, req.model_index, req.kind, &c.logprobs))
                .flatten(),
            // token ids where this process tokenized the prompt
            prompt_token_ids: (req.return_token_ids && !req.seqs[i].prompt.is_empty())
                .then(|| req.seqs[i].prompt.clone()),
            ..Default::default()
        };
        answer(&mut choice, &req, i, c.text, d.finish_reason.as_str());
        choices.push(choice);
    }
    let usage = tally.usage(&req);
    let body = WireResponse {
        id: req.kind.id(),
        object: if req.kind == Kind::Chat {
            "chat.completion"
        } else {
            "text_completion"
        }
        .into(),
        created: now_secs(),
        model: req.model.clone(),
        system_fingerprint: Some("abserve".into()),
        choices,
        usage: Some(usage),
        abserve: req.routed.as_ref().map(|r| Routing {
            in_experiment: r.record && recorded,
            ..routing(r)
        }),
    };
    Ok(Json(body).into_response())
}

/// Builds the chunks of one streamed response (id, model and object are fixed for all).
#[derive(Clone)]
struct Chunker {
    template: Chunk,
    kind: Kind,
    /// The model whose tokens these are (its position in the registry).
    model: usize,
    want_lp: bool,
    /// The request's priority class (its time to first token is observed per class).
    class: Class,
    state: Arc<AppState>,
    /// Per choice with tools, its calls as they are written (`tool_calls.rs`) and its
    /// log-probabilities, held until it finishes.
    tools: Arc<Mutex<Vec<Option<(Streamed, Vec<TokenLogprob>)>>>>,
}

/// What a chunker turns an engine event into.
enum Piece {
    Chunk(Chunk),
    /// An error in the stream and its message.
    Error(ErrorBody, String),
    /// Choice `.2`'s last chunks (its finish reason in the last).
    Last(Vec<Chunk>, Completion, usize),
}

impl Chunker {
    fn chunk(&self, choices: Vec<ChunkChoice>) -> Chunk {
        Chunk {
            choices,
            ..self.template.clone()
        }
    }

    /// A choice carrying `text` as the endpoint carries it (`delta.content` or `text`).
    fn choice(&self, i: usize, text: Option<String>) -> ChunkChoice {
        match self.kind {
            Kind::Chat => ChunkChoice {
                index: i as u32,
                delta: Some(Delta {
                    content: text,
                    ..Default::default()
                }),
                ..Default::default()
            },
            Kind::Text => ChunkChoice {
                index: i as u32,
                text: Some(text.unwrap_or_default()),
                ..Default::default()
            },
        }
    }

    /// The chunk an engine event of choice `i` becomes (none for admission and empty tokens).
    fn piece(&self, i: usize, ev: Event) -> Option<Piece> {
        let mut tools = self.tools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((calls, lps)) = &mut tools[i] {
            return self.tool_piece(i, calls, lps, ev);
        }
        drop(tools);
        match ev {
            Event::Token { text, logprob, .. } => {
                if text.is_empty() && logprob.is_none() {
                    return None;
                }
                let mut c = self.choice(i, Some(text));
                if self.want_lp {
                    let l: Vec<TokenLogprob> = logprob.into_iter().collect();
                    c.logprobs = logprobs(&self.state, self.model, self.kind, &l);
                }
                Some(Piece::Chunk(self.chunk(vec![c])))
            }
            Event::Done(d) => {
                observe(&self.state, self.class, &d);
                let tail = (!d.tail_text.is_empty()).then(|| d.tail_text.clone());
                let mut c = self.choice(i, tail);
                c.finish_reason = Some(d.finish_reason.as_str().to_string());
                Some(Piece::Last(vec![self.chunk(vec![c])], d, i))
            }
            Event::Error(e) => self.error(e),
            Event::Admitted { .. } => None,
        }
    }

    /// A choice with tools: its calls as they are written, its content when it finishes.
    fn tool_piece(
        &self,
        i: usize,
        calls: &mut Streamed,
        lps: &mut Vec<TokenLogprob>,
        ev: Event,
    ) -> Option<Piece> {
        match ev {
            Event::Token { text, logprob, .. } => {
                lps.extend(logprob);
                let choices = calls.push(&text);
                (!choices.is_empty()).then(|| Piece::Chunk(self.chunk(choices)))
            }
            Event::Done(d) => {
                observe(&self.state, self.class, &d);
                let choices = calls.finish(&d.tail_text, d.finish_reason.as_str());
                let mut chunks: Vec<Chunk> =
                    choices.into_iter().map(|c| self.chunk(vec![c])).collect();
                if self.want_lp {
                    if let Some(c) = chunks.first_mut().and_then(|c| c.choices.first_mut()) {
                        c.logprobs = logprobs(&self.state, self.model, self.kind, lps);
                    }
                }
                Some(Piece::Last(chunks, d, i))
            }
            Event::Error(e) => self.error(e),
            Event::Admitted { .. } => None,
        }
    }

    fn error(&self, e: abserve_engine::GenerationError) -> Option<Piece> {
        self.state.metrics.generation_error(&e);
        let message = e.to_string();
        let error = ErrorObject {
            message: message.clone(),
            kind: Some("server_error".into()),
            param: None,
            code: None,
        };
        Some(Piece::Error(ErrorBody { error }, message))
    }
}

/// What a streamed response has seen, for its exposure and its usage chunk: the first choice's
/// completion and the first error (as a whole response records them), and the tokens.
#[derive(Default)]
struct Seen {
    first_done: Option<Completion>,
    first_error: Option<String>,
    /// Its exposure was recorded (at the stream's end, or when it was dropped before).
    recorded: bool,
    tally: Tally,
}

/// The first chunk of every choice of a chat stream: the assistant's role, empty content (none
/// for completions).
fn role_chunks(chunker: &Chunker, choices: usize) -> Vec<Chunk> {
    if chunker.kind != Kind::Chat {
        return vec![];
    }
    (0..choices)
        .map(|i| {
            let delta = Delta {
                role: Some("assistant".into()),
                content: Some(String::new()),
                tool_calls: None,
            };
            chunker.chunk(vec![ChunkChoice {
                index: i as u32,
                delta: Some(delta),
                ..Default::default()
            }])
        })
        .collect()
}

/// What turns a streamed request's events into chunks: its template and its choices' tools.
fn chunker(state: &Arc<AppState>, req: &ValidRequest) -> Chunker {
    let object = if req.kind == Kind::Chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let template = Chunk {
        id: req.kind.id(),
        object: object.into(),
        created: now_secs(),
        model: req.model.clone(),
        system_fingerprint: Some("abserve".into()),
        ..Default::default()
    };
    let chunker = Chunker {
        template,
        kind: req.kind,
        model: req.model_index,
        want_lp: req.logprobs(),
        class: req.class,
        state: state.clone(),
        tools: Arc::new(Mutex::new(
            req.seqs
                .iter()
                .enumerate()
                .map(|(i, p)| match (req.kind, &p.tools) {
                    (Kind::Chat, Some(t)) => Some((Streamed::new(t, i as u32), Vec::new())),
                    _ => None,
                })
                .collect(),
        )),
    };
    chunker
}

/// Merges the per-choice event streams into OpenAI's chunk sequence.
pub(crate) fn stream_response(
    state: Arc<AppState>,
    req: ValidRequest,
    rxs: Vec<UnboundedReceiver<Event>>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let chunker = chunker(&state, &req);
    // role chunks first (chat only)
    let head = role_chunks(&chunker, rxs.len());
    let merged = stream::select_all(rxs.into_iter().enumerate().map(|(i, rx)| {
        stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) },
        )
        .map(move |ev| (i, ev))
        .boxed()
    }));
    let seen: Arc<Mutex<Seen>> = Default::default();
    let body = {
        let (chunker, seen) = (chunker.clone(), seen.clone());
        merged
            .filter_map(move |(i, ev)| std::future::ready(chunker.piece(i, ev)))
            .map(move |p| {
                // a poisoned lock is read through: the fields stay consistent (plain assignments)
                let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                let events = match p {
                    Piece::Chunk(c) => vec![sse(&c)],
                    Piece::Error(body, message) => {
                        s.first_error.get_or_insert(message);
                        vec![sse(&body)]
                    }
                    Piece::Last(cs, d, i) => {
                        s.tally.add(i, &d);
                        s.first_done.get_or_insert(d);
                        cs.iter().map(sse).collect()
                    }
                };
                stream::iter(events)
            })
            .flatten()
    };
    // a client that stops reading (the openai SDK raises at an error event and closes) drops
    // the stream, this tail included, before the tail records the exposure: the guard does then
    let guard = RecordOnDrop {
        state: state.clone(),
        routed: req.routed.clone(),
        seen: seen.clone(),
    };
    let tail = stream::once(finish_stream(state, req, chunker, seen, guard))
        .filter_map(|x| async move { x });
    let events = stream::iter(head.iter().map(sse).collect::<Vec<_>>())
        .chain(body)
        .chain(tail)
        .chain(stream::once(async {
            Ok(SseEvent::default().data("[DONE]"))
        }));
    Sse::new(events)
}

/// Records a routed stream's exposure when the stream is dropped before its tail recorded it,
/// once an answer or an error was seen (a client gone before either leaves none, as before).
struct RecordOnDrop {
    state: Arc<AppState>,
    routed: Option<crate::experiments::Routed>,
    seen: Arc<Mutex<Seen>>,
}

impl Drop for RecordOnDrop {
    fn drop(&mut self) {
        let Some(r) = self.routed.take() else { return };
        let (done, err) = {
            let mut s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if s.recorded || (s.first_done.is_none() && s.first_error.is_none()) {
                return;
            }
            s.recorded = true;
            (s.first_done.clone(), s.first_error.clone())
        };
        let state = self.state.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = state.experiments.record(&r, done.as_ref(), err).await;
            });
        }
    }
}

/// After the last choice ended: records the exposure, then gives the usage chunk if asked for.
async fn finish_stream(
    state: Arc<AppState>,
    req: ValidRequest,
    chunker: Chunker,
    seen: Arc<Mutex<Seen>>,
    // held until the exposure is recorded here (it records nothing then)
    _guard: RecordOnDrop,
) -> Option<Result<SseEvent, Infallible>> {
    let (done, err, tally, recorded) = {
        let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
        let recorded = std::mem::replace(&mut s.recorded, true);
        (
            s.first_done.clone(),
            s.first_error.clone(),
            s.tally.clone(),
            recorded,
        )
    };
    if let (Some(r), false) = (&req.routed, recorded) {
        // failures are logged and counted by expose
        let _ = state.experiments.record(r, done.as_ref(), err).await;
    }
    if !req.include_usage {
        return None;
    }
    let mut c = chunker.chunk(vec![]);
    c.usage = Some(tally.usage(&req));
    Some(sse(&c))
}

fn sse<T: serde::Serialize>(v: &T) -> Result<SseEvent, Infallible> {
    // serialising these types cannot fail (string keys, finite or null floats)
    Ok(SseEvent::default().data(serde_json::to_string(v).unwrap_or_default()))
}
