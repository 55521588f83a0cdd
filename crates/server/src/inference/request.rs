//! A request after validation and routing, on its way to its model: its prepared sequences,
//! its routing and how to answer it ([`ValidRequest`]).

use abserve_engine::Class;
use abserve_models::Prepared;

use crate::experiments::Routed;

/// Which endpoint answers: chat (`message`/`delta`) or completions (`text`).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Chat,
    Text,
}

/// A request's sequences, each prepared by the model that runs it (for an engine of this
/// process: tokens checked against the context, sampling parameters checked), and how to
/// answer it.
pub(crate) struct ValidRequest {
    /// The answer's id (`chatcmpl-…`, `cmpl-…`), which its exposure and sample carry too.
    pub id: String,
    /// One per choice: `n` per prompt, prompts in order.
    pub seqs: Vec<Prepared>,
    /// Choices per prompt (`n`).
    pub n: usize,
    pub model: String,
    /// The model that runs it: its position in the registry.
    pub model_index: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Each choice carries its prompt's token ids (`return_token_ids`).
    pub return_token_ids: bool,
    pub kind: Kind,
    pub routed: Option<Routed>,
    /// Its priority class and vLLM's `priority` within it (`body_rules::placement_of`).
    pub class: Class,
    pub priority: i32,
}

impl ValidRequest {
    /// The choices report log-probabilities.
    pub fn logprobs(&self) -> bool {
        self.seqs.iter().any(|s| s.logprobs.is_some())
    }
}
