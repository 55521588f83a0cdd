//! A [`Call`] (messages and the one `Sampling`) on the engine in this process — what `abserve
//! eval` runs in process and `abserve worker` runs for queued jobs — prepared by the one
//! preparation stage ([`crate::prepare`]) like every request `serve` takes.
//!
//! A call reuses cached prompt prefixes (a variant's system prompt is computed once per run,
//! not once per row; see docs/engine.md for what a seed then guarantees) and always carries its
//! length (`max_tokens`, [`DEFAULT_MAX_TOKENS`] when its variant sets none).

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

/// Runs `call` to the end: a call the preparation stage refuses is `Failed` with the field
/// named, a full queue is `Overloaded`, a generation error `Failed`.
pub async fn chat(engine: &Engine, call: &Call) -> Result<Generation, CallError> {
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
