//! A request after validation and routing, on its way to the engine: its prepared sequences
//! and routing ([`ValidRequest`]), and the exposure a routed request records ([`expose`]).

use abserve_engine::prepare::Prepared;
use abserve_engine::Completion;

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

/// A request's sequences, each prepared by the engine's preparation stage (tokens checked
/// against the context, sampling parameters checked), and how to answer it.
pub(crate) struct ValidRequest {
    /// One per choice: `n` per prompt, prompts in order.
    pub seqs: Vec<Prepared>,
    pub model: String,
    /// The model whose engine runs it (`AppState::model_index`).
    pub model_index: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Each choice carries its prompt's token ids (`return_token_ids`).
    pub return_token_ids: bool,
    pub kind: Kind,
    pub routed: Option<Routed>,
}

impl ValidRequest {
    /// The choices report log-probabilities.
    pub fn logprobs(&self) -> bool {
        self.seqs.iter().any(|s| s.params.logprobs.is_some())
    }
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
        constrained: d.is_some_and(|d| d.grammar.is_some()),
        grammar_complete: d.and_then(|d| d.grammar.map(|g| g.complete)),
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
