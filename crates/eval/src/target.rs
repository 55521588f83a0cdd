//! Where generations come from: the abserve engine in this process, or any OpenAI-compatible
//! endpoint over HTTP (abserve, vLLM, llama.cpp server, OpenAI). Both give the same
//! [`Generation`] with time to first token measured by streaming.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abserve_engine::prepare::{sampling_params, Input, Options};
use abserve_engine::ChatMessage;
use abserve_engine::{Engine, SubmitError};
use abserve_protocol::wire::{ChatRequest, Common, Message};
use abserve_protocol::Sampling;
use abserve_protocol::{names, ClientError};
use serde::{Deserialize, Serialize};

use crate::error::EvalError;

/// One chat request of a variant for a row: the same messages and [`Sampling`] whether it runs
/// in process (through `abserve_engine::prepare`), on a worker, or over HTTP (where the server
/// prepares it the same way).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// What eval asks of every call besides its sampling settings: prompt reuse on (a variant's
/// system prompt is computed once per run, not once per row; see docs/engine.md for what a seed
/// then guarantees), and no default length (a call always carries `max_tokens`).
fn call_options() -> Options {
    Options {
        cache_prompt: Some(true),
        ..Options::new(DEFAULT_MAX_TOKENS)
    }
}

/// `max_tokens` of a call whose variant sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 256;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Generation {
    pub text: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub ttft: Duration,
    pub latency: Duration,
    pub finish_reason: String,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    /// 429 or a full engine queue: try again after the hint.
    #[error("still overloaded (429)")]
    Overloaded { retry_after: Option<Duration> },
    /// Connection errors and 5xx: worth a few retries.
    #[error("{0}")]
    Transient(String),
    /// Everything else (4xx, bad responses): recorded, not retried.
    #[error("{0}")]
    Failed(String),
}

pub struct Http {
    api: abserve_protocol::Client,
    pub model: String,
}

pub enum Target {
    Engine(Arc<Engine>),
    Http(Http),
}

/// How many requests to keep in flight, and where that number came from.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    pub concurrency: usize,
    pub source: String,
    /// The target is abserve (memory and KV can be shown).
    pub abserve: bool,
}

impl Http {
    /// Connects to an endpoint; without `model`, the first id of `GET /v1/models` is used.
    pub async fn connect(
        url: &str,
        key: Option<String>,
        model: Option<String>,
    ) -> Result<Http, EvalError> {
        let api = abserve_protocol::Client::new(url, key, Duration::from_secs(600))?;
        let model = match model {
            Some(m) => m,
            None => api.first_model().await.map_err(EvalError::NoModel)?,
        };
        Ok(Http { api, model })
    }

    async fn chat(&self, call: &Call) -> Result<Generation, CallError> {
        // what eval computes itself is checked the same way as in process: a call the engine
        // would refuse is not sent
        sampling_params(&call.sampling, &call_options())
            .map_err(|e| CallError::Failed(format!("{}: {e}", e.field)))?;
        let body = ChatRequest {
            common: Common {
                model: Some(self.model.clone()),
                sampling: call.sampling.clone(),
                ..Default::default()
            },
            messages: call
                .messages
                .iter()
                .map(|m| Message::new(&m.role, &m.content))
                .collect(),
            ..Default::default()
        };
        let out = self.api.chat(body, true).await.map_err(|e| match e {
            ClientError::Status {
                status: 429,
                retry_after,
                ..
            } => CallError::Overloaded { retry_after },
            ClientError::Status { status, .. } if status >= 500 => {
                CallError::Transient(e.to_string())
            }
            ClientError::Transport { .. } | ClientError::Stream(_) | ClientError::Incomplete => {
                CallError::Transient(e.to_string())
            }
            ClientError::Status { .. } | ClientError::BadChunk(_) | ClientError::ServerError(_) => {
                CallError::Failed(e.to_string())
            }
        })?;
        let usage = out.usage.unwrap_or_default();
        Ok(Generation {
            text: out.text,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            ttft: out.timing.ttft.unwrap_or(out.latency),
            latency: out.latency,
            finish_reason: out.finish_reason.unwrap_or_default(),
        })
    }
}

impl Target {
    pub async fn chat(&self, call: &Call) -> Result<Generation, CallError> {
        match self {
            Target::Http(h) => h.chat(call).await,
            Target::Engine(e) => engine_chat(e, call).await,
        }
    }

    /// In-process: the plan's sequence slots. abserve: its `/ready` plan. Elsewhere `fallback`.
    pub async fn capacity(&self, fallback: usize) -> Capacity {
        match self {
            Target::Engine(e) => Capacity {
                concurrency: e.plan().seq_slots.max(1) as usize,
                source: "memory plan".into(),
                abserve: true,
            },
            Target::Http(h) => match h
                .api
                .ready(Duration::from_secs(30))
                .await
                .map(|r| r.plan.seq_slots)
                .filter(|n| *n > 0)
            {
                Some(n) => Capacity {
                    concurrency: n as usize,
                    source: format!("{}/ready", h.api.base()),
                    abserve: true,
                },
                None => Capacity {
                    concurrency: fallback.max(1),
                    source: "-j".into(),
                    abserve: false,
                },
            },
        }
    }

    /// Resident memory of the process that holds the model, when it can be known.
    pub async fn memory(&self) -> Option<u64> {
        match self {
            Target::Engine(_) => Some(abserve_engine::plan::current_rss()),
            Target::Http(h) => h
                .api
                .metrics(Duration::from_secs(2))
                .await?
                .get(names::PROCESS_RESIDENT_MEMORY)
                .map(|b| b as u64),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Target::Engine(e) => format!("in-process engine ({})", e.model_path().display()),
            Target::Http(h) => format!("{} (model '{}')", h.api.base(), h.model),
        }
    }
}

async fn engine_chat(engine: &Engine, call: &Call) -> Result<Generation, CallError> {
    let prepared = engine
        .prepare(Input::Chat(&call.messages), &call.sampling, &call_options())
        .map_err(|e| CallError::Failed(format!("{}: {e}", e.field)))?;
    let started = Instant::now();
    let rx = match engine.submit(prepared.request()) {
        Ok(rx) => rx,
        Err(SubmitError::QueueFull(_)) => return Err(CallError::Overloaded { retry_after: None }),
        Err(e) => return Err(CallError::Failed(e.to_string())),
    };
    let o = abserve_engine::collect(rx)
        .await
        .map_err(|e| CallError::Failed(e.to_string()))?;
    let latency = started.elapsed();
    Ok(Generation {
        text: o.text,
        prompt_tokens: o.completion.prompt_tokens as u64,
        completion_tokens: o.completion.completion_tokens as u64,
        ttft: o.first_token_after.unwrap_or(latency),
        latency,
        finish_reason: o.completion.finish_reason.as_str().into(),
    })
}
