//! A [`Call`] (messages and the one `Sampling`) run on the model of the registry it names — what
//! `abserve eval` runs in process and `abserve worker` runs for queued jobs — prepared by that
//! model as every request `serve` takes is.
//!
//! A call reuses cached prompt prefixes (a variant's system prompt is computed once per run,
//! not once per row; see docs/engine.md for what a seed then guarantees) and always carries its
//! length (`max_tokens`, [`DEFAULT_MAX_TOKENS`] when its variant sets none).

use std::time::Instant;

use abserve_protocol::calls::{tool_calls_text, Call, CallError, Generation, DEFAULT_MAX_TOKENS};

use abserve_engine::prepare::{Input, Options};
use abserve_engine::{Class, Placement, SubmitError};

use crate::Registry;

/// The options every call is prepared with (eval checks a call it sends over HTTP with them).
pub fn options() -> Options {
    Options {
        cache_prompt: Some(true),
        ..Options::new(DEFAULT_MAX_TOKENS)
    }
}

/// Runs `call` to the end on the model it names: a model this process does not run, or a call
/// the preparation stage refuses, is `Failed` with the field named, a full queue is
/// `Overloaded`, a generation error `Failed`.
pub async fn chat(models: &Registry, call: &Call) -> Result<Generation, CallError> {
    let model = models.named(call.model.as_deref()).map_err(|why| {
        CallError::Failed(format!(
            "the variant names a model this process does not run: {why} (give it with --model ID=FILE)"
        ))
    })?;
    let prepared = model
        .prepare(
            Input::Chat(&call.messages),
            &call.sampling,
            &call.structure,
            &options(),
            usize::MAX,
        )
        .map_err(|e| CallError::Failed(format!("{}: {e}", e.field)))?;
    let started = Instant::now();
    let tools = prepared.tools.clone();
    let rx = match model.submit(vec![prepared], Placement::of(Class::Batch)) {
        Ok(mut rx) => rx.remove(0),
        Err(SubmitError::QueueFull(_)) => return Err(CallError::Overloaded { retry_after: None }),
        Err(e) => return Err(CallError::Failed(e.to_string())),
    };
    let o = abserve_engine::collect(rx)
        .await
        .map_err(|e| CallError::Failed(e.to_string()))?;
    let latency = started.elapsed();
    // an answer with tools is scored as its calls or its content, as over HTTP
    let text = match tools.map(|t| abserve_engine::tools::parse(t.format, &o.text)) {
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
