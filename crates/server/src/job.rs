//! A request after validation and routing, on its way to the engine: its prompts, sampling
//! parameters and routing ([`ValidRequest`]); the context check every prompt passes ([`fit_context`]);
//! and the exposure a routed request records ([`expose`]).

use abserve_engine::{Completion, SamplingParams};

use crate::error::ApiError;
use crate::state::AppState;

/// Which endpoint answers: chat (`message`/`delta`) or completions (`text`).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Chat,
    Text,
}

/// What a routed request turned into.
#[derive(Debug, Clone)]
pub struct Routed {
    pub experiment: String,
    pub variant: String,
    pub unit: Option<String>,
    pub forced: bool,
    /// An exposure is recorded (the unit is in a running experiment and not forced... or forced, flagged).
    pub record: bool,
    pub kv_share: Option<f64>,
}

/// Tokenized prompts plus sampling parameters, checked against the context.
pub(crate) struct ValidRequest {
    pub prompts: Vec<Vec<i32>>,
    pub params: SamplingParams,
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    pub kind: Kind,
    pub routed: Option<Routed>,
}

/// Checks a prompt against the context: not empty, at most `--max-prompt-tokens`, and room
/// left for `max_tokens` — clamped to the room when the caller did not set it (`explicit_max`),
/// a 400 naming the numbers when it did.
pub(crate) fn fit_context(
    state: &AppState,
    prompt: &[i32],
    params: &mut SamplingParams,
    explicit_max: bool,
) -> Result<(), ApiError> {
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

/// Records the exposure of a routed request (committed before the response goes out).
pub(crate) async fn expose(
    state: &AppState,
    routed: &Routed,
    d: Option<&Completion>,
    error: Option<String>,
) -> Result<(), ApiError> {
    let (Some(ab), true) = (state.ab.as_ref(), routed.record) else {
        return Ok(());
    };
    let x = abserve_ab::Exposure {
        variant: routed.variant.clone(),
        unit: routed.unit.clone().unwrap_or_default(),
        forced: routed.forced,
        latency_ms: d.map(|d| d.total_time.as_secs_f64() * 1e3),
        ttft_ms: d.map(|d| d.time_to_first_token.as_secs_f64() * 1e3),
        output_tokens: d.map(|d| d.completion_tokens as u64),
        error,
    };
    let r = ab.record_exposure(routed.experiment.clone(), x).await;
    if let Err(e) = &r {
        tracing::error!(
            "recording an exposure of experiment '{}' failed: {}",
            routed.experiment,
            e.message
        );
        state.metrics.store_error("exposure");
    }
    r
}
