//! A [`Call`] (messages and the one `Sampling`) on the engine in this process — what `abserve
//! eval` runs in process and `abserve worker` runs for queued jobs — prepared by the one
//! preparation stage ([`crate::prepare`]) like every request `serve` takes.
//!
//! A call reuses cached prompt prefixes (a variant's system prompt is computed once per run,
//! not once per row; see docs/engine.md for what a seed then guarantees) and always carries its
//! length (`max_tokens`, [`DEFAULT_MAX_TOKENS`] when its variant sets none).

use std::sync::Arc;
use std::time::Instant;

use abserve_protocol::calls::{tool_calls_text, Call, CallError, Generation, DEFAULT_MAX_TOKENS};

use crate::engine::Engine;
use crate::prepare::{Input, Options};
use crate::request::SubmitError;

/// The options every call is prepared with (eval checks a call it sends over HTTP with them).
pub fn options() -> Options {
    Options {
        cache_prompt: Some(true),
        ..Options::new(DEFAULT_MAX_TOKENS)
    }
}

/// The models of one process by id, the first the default (`--model ID=FILE`, repeated): eval
/// in process and `abserve worker` run each call on the model it names.
pub struct Engines {
    models: Vec<(String, Arc<Engine>)>,
}

impl Engines {
    /// `models` by id, the default first; at least one.
    pub fn new(models: Vec<(String, Arc<Engine>)>) -> Engines {
        assert!(!models.is_empty(), "Engines::new needs a model");
        Engines { models }
    }

    /// The default model's engine.
    pub fn first(&self) -> &Arc<Engine> {
        &self.models[0].1
    }

    /// Every model, by id, the default first.
    pub fn iter(&self) -> impl Iterator<Item = &(String, Arc<Engine>)> {
        self.models.iter()
    }

    /// Sequence slots of every model's plan together.
    pub fn seq_slots(&self) -> u64 {
        self.models.iter().map(|(_, e)| e.plan().seq_slots).sum()
    }

    /// The engine of the model `call` names (the default without one), or why there is none.
    pub fn for_call(&self, call: &Call) -> Result<&Engine, CallError> {
        let Some(m) = &call.model else {
            return Ok(self.first());
        };
        match self.models.iter().find(|(id, _)| id == m) {
            Some((_, e)) => Ok(e),
            None => {
                let ids: Vec<&str> = self.models.iter().map(|(id, _)| id.as_str()).collect();
                Err(CallError::Failed(format!(
                    "the variant names the model '{m}', and this process runs {} (give it with --model {m}=FILE)",
                    ids.join(", ")
                )))
            }
        }
    }
}

/// Runs `call` to the end on the model it names: a model this process does not run, or a call
/// the preparation stage refuses, is `Failed` with the field named, a full queue is
/// `Overloaded`, a generation error `Failed`.
pub async fn chat(engines: &Engines, call: &Call) -> Result<Generation, CallError> {
    let engine = engines.for_call(call)?;
    let prepared = engine
        .prepare(
            Input::Chat(&call.messages),
            &call.sampling,
            &call.structure,
            &options(),
        )
        .map_err(|e| CallError::Failed(format!("{}: {e}", e.field)))?;
    let started = Instant::now();
    let tools = prepared.tools.clone();
    let rx = match engine.submit(prepared.request()) {
        Ok(rx) => rx,
        Err(SubmitError::QueueFull(_)) => return Err(CallError::Overloaded { retry_after: None }),
        Err(e) => return Err(CallError::Failed(e.to_string())),
    };
    let o = crate::collect(rx)
        .await
        .map_err(|e| CallError::Failed(e.to_string()))?;
    let latency = started.elapsed();
    // an answer with tools is scored as its calls or its content, as over HTTP
    let text = match tools.map(|t| crate::tools::parse(t.format, &o.text)) {
        None => o.text,
        Some(p) if p.calls.is_empty() => p.content.unwrap_or_default(),
        Some(p) => {
            let c: Vec<(String, String)> =
                p.calls.into_iter().map(|c| (c.name, c.arguments)).collect();
            tool_calls_text(&c)
        }
    };
    Ok(Generation {
        text,
        prompt_tokens: o.completion.prompt_tokens as u64,
        completion_tokens: o.completion.completion_tokens as u64,
        ttft: o.first_token_after.unwrap_or(latency),
        latency,
        finish_reason: o.completion.finish_reason.as_str().into(),
    })
}
