//! Answers in OpenAI's shapes (`abserve_protocol::wire`): a whole response once every choice
//! finished (here), or a stream of chunks as server-sent events (`stream`). Both record the
//! exposure of a routed request with the same fields: the first choice's completion and the
//! first error (and a sampled request's first answer).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use abserve_engine::{Class, Completion, Event, TokenLogprob};
use abserve_protocol::wire::{
    ChatLogprobs, Choice, Logprobs, PromptTokensDetails, Response as WireResponse, ResponseMessage,
    Routing, TextLogprobs, TokenLogprob as WireLogprob, TopLogprob, Usage,
};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::request::{Kind, ValidRequest};
use crate::error::ApiError;
use crate::experiments::{Answer, Routed};
use crate::state::AppState;

impl Kind {
    /// A fresh answer id for this endpoint.
    pub(crate) fn id(self) -> String {
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
pub(super) fn logprobs(
    state: &AppState,
    model: usize,
    kind: Kind,
    lps: &[TokenLogprob],
) -> Option<Logprobs> {
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
pub(super) struct Tally {
    completion_tokens: usize,
    /// Prompt tokens of every choice whose KV came from a cached prefix.
    cached_tokens: usize,
    /// Each choice's prompt tokens as its model counted them (known once it finished).
    prompt_tokens: Vec<Option<usize>>,
}

impl Tally {
    /// Choice `i` finished with `d`.
    pub(super) fn add(&mut self, i: usize, d: &Completion) {
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
    pub(super) fn usage(&self, req: &ValidRequest) -> Usage {
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

/// A sampled request's first answer: its text and the tool calls read from it.
fn sampled_answer(req: &ValidRequest, text: &str, d: &Completion) -> Answer {
    let mut c = Choice::default();
    answer(&mut c, req, 0, text.to_string(), d.finish_reason.as_str());
    let tool_calls = c
        .message
        .and_then(|m| m.tool_calls)
        .and_then(|t| serde_json::to_value(t).ok());
    Answer {
        text: text.to_string(),
        tool_calls,
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
        let answer = match (&r.sampled, results.first()) {
            (Some(_), Some(Ok(c))) => Some(sampled_answer(&req, &c.text, &c.completion)),
            _ => None,
        };
        recorded = state
            .experiments
            .record(r, req.class, first, err, answer)
            .await
            .is_ok();
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
        id: req.id.clone(),
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
