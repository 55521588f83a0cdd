//! Where generations come from: the abserve engine in this process, or any OpenAI-compatible
//! endpoint over HTTP (abserve, vLLM, llama.cpp server, OpenAI). Both give the same
//! [`Generation`] with time to first token measured by streaming.

use std::sync::Arc;
use std::time::Duration;

use abserve_engine::prepare::sampling_params;
pub use abserve_protocol::calls::{Call, CallError, Generation, DEFAULT_MAX_TOKENS};
use abserve_protocol::wire::{ChatRequest, Common, Message};
use abserve_protocol::{names, ClientError};
use serde::Serialize;

use crate::error::EvalError;

pub struct Http {
    api: abserve_protocol::Client,
    pub model: String,
    /// Sent as every request's `service_tier` (abserve: `batch` runs the eval behind live
    /// traffic; see docs/engine.md), when set.
    service_tier: Option<String>,
}

pub enum Target {
    Engine(Arc<abserve_models::Registry>),
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
        Ok(Http {
            api,
            model,
            service_tier: None,
        })
    }

    /// This endpoint with every request sent at `tier` (`service_tier`).
    pub fn at_tier(self, tier: Option<String>) -> Http {
        Http {
            service_tier: tier,
            ..self
        }
    }

    async fn chat(&self, call: &Call) -> Result<Generation, CallError> {
        // what eval computes itself is checked the same way as in process: a call the engine
        // would refuse is not sent
        sampling_params(&call.sampling, &abserve_models::call::options())
            .map_err(|e| CallError::Failed(format!("{}: {e}", e.field)))?;
        let body = ChatRequest {
            common: Common {
                model: Some(call.model.clone().unwrap_or_else(|| self.model.clone())),
                sampling: call.sampling.clone(),
                structure: call.structure.clone(),
                service_tier: self.service_tier.clone(),
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
        let text = if out.tool_calls.is_empty() {
            out.text
        } else {
            let calls: Vec<(String, String)> = out
                .tool_calls
                .into_iter()
                .map(|c| (c.function.name, c.function.arguments))
                .collect();
            abserve_protocol::calls::tool_calls_text(&calls)
        };
        Ok(Generation {
            text,
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
            Target::Engine(e) => abserve_models::call::chat(e, call).await,
        }
    }

    /// In-process: the plan's sequence slots. abserve: its `/ready` plan. Elsewhere `fallback`.
    pub async fn capacity(&self, fallback: usize) -> Capacity {
        match self {
            Target::Engine(e) => Capacity {
                concurrency: e.seq_slots().max(1) as usize,
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
            Target::Engine(e) => {
                let models: Vec<String> = e
                    .iter()
                    .map(|m| format!("{}: {}", m.id, m.origin()))
                    .collect();
                format!("in-process engine ({})", models.join(", "))
            }
            Target::Http(h) => format!("{} (model '{}')", h.api.base(), h.model),
        }
    }
}
