//! Streamed answers: the per-choice event streams merged into OpenAI's chunk sequence (a role
//! chunk per choice for chat, content chunks, a finish chunk per choice, the usage chunk when
//! asked for, `[DONE]`), the exposure recorded at the stream's end — or when the client drops
//! the stream first — with the first choice's completion, the first error and, for a sampled
//! request, the first choice's text.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use abserve_engine::{Class, Completion, Event, TokenLogprob};
use abserve_protocol::wire::{Chunk, ChunkChoice, Delta, ErrorBody, ErrorObject};
use axum::response::sse::{Event as SseEvent, Sse};
use futures::stream::{self, Stream, StreamExt};
use tokio::sync::mpsc::UnboundedReceiver;

use super::request::{Kind, ValidRequest};
use super::respond::{logprobs, now_secs, observe, Tally};
use super::tool_calls::Streamed;
use crate::experiments::{Answer, Routed};
use crate::state::AppState;

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
    /// The first choice's text so far, kept only for a sampled request.
    text: String,
}

impl Seen {
    /// What a sampled stream answered (`None` for one not sampled).
    fn answer(&self, routed: &Routed) -> Option<Answer> {
        routed.sampled.as_ref().map(|_| Answer {
            text: self.text.clone(),
            tool_calls: None,
        })
    }
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
        id: req.id.clone(),
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
    let keep_text = req.routed.as_ref().is_some_and(|r| r.sampled.is_some());
    let body = {
        let (chunker, seen, seen_text) = (chunker.clone(), seen.clone(), seen.clone());
        merged
            .inspect(move |(i, ev)| {
                // the first choice's text, for a sampled request's sample
                let piece = match ev {
                    Event::Token { text, .. } => text.as_str(),
                    Event::Done(d) => d.tail_text.as_str(),
                    _ => "",
                };
                if keep_text && *i == 0 && !piece.is_empty() {
                    let mut s = seen_text.lock().unwrap_or_else(|p| p.into_inner());
                    s.text.push_str(piece);
                }
            })
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
        class: req.class,
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
    class: Class,
    seen: Arc<Mutex<Seen>>,
}

impl Drop for RecordOnDrop {
    fn drop(&mut self) {
        let Some(r) = self.routed.take() else { return };
        let (done, err, answer) = {
            let mut s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if s.recorded || (s.first_done.is_none() && s.first_error.is_none()) {
                return;
            }
            s.recorded = true;
            (s.first_done.clone(), s.first_error.clone(), s.answer(&r))
        };
        let (state, class) = (self.state.clone(), self.class);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = state
                    .experiments
                    .record(&r, class, done.as_ref(), err, answer)
                    .await;
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
    let (done, err, tally, recorded, answer) = {
        let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
        let recorded = std::mem::replace(&mut s.recorded, true);
        let answer = req.routed.as_ref().and_then(|r| s.answer(r));
        (
            s.first_done.clone(),
            s.first_error.clone(),
            s.tally.clone(),
            recorded,
            answer,
        )
    };
    if let (Some(r), false) = (&req.routed, recorded) {
        // failures are logged and counted by expose
        let _ = state
            .experiments
            .record(r, req.class, done.as_ref(), err, answer)
            .await;
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
