//! What callers send to the engine and what comes back on each request's channel.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

use crate::adapters::{AdapterLease, AdapterSet};
use crate::grammar::Constraint;
use crate::sampler::{SamplingParams, TokenLogprob};
pub use abserve_protocol::Class;

/// One generation request, already tokenized and validated by the caller.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<i32>,
    pub params: SamplingParams,
    /// Fairness and quota group (an experiment); `None` for plain requests.
    pub group: Option<String>,
    /// Readiness probes: admitted before the queue and every class, never beyond the memory
    /// plan, never preempted.
    pub probe: bool,
    /// Who waits for whom: a waiting request of a higher class is admitted before any lower
    /// one, and takes a lower one's slot when none is free (`scheduler/classes.rs`).
    pub class: Class,
    /// Order within a class, vLLM's `priority`: lower first (default 0).
    pub priority: i32,
    /// Largest share (0, 1] of KV cells the running sequences of `group` may hold.
    pub kv_share: Option<f64>,
    /// The grammar the answer must match (compiled by the preparation stage), if any.
    pub constraint: Option<Constraint>,
    /// The LoRA adapters it runs under (empty: the base model), admitted into the plan's
    /// adapter reservation by the preparation stage.
    pub adapters: AdapterSet,
    /// Keeps those adapters loaded while the request lives (its sequence takes it over).
    pub lease: AdapterLease,
}

impl Request {
    pub fn new(prompt: Vec<i32>, params: SamplingParams) -> Self {
        Request {
            prompt,
            params,
            group: None,
            probe: false,
            class: Class::default(),
            priority: 0,
            kv_share: None,
            constraint: None,
            adapters: AdapterSet::default(),
            lease: AdapterLease::default(),
        }
    }
}

/// Where a request's sequences stand among the others on their model: the fairness group and
/// memory share of an experiment, and their priority class and `priority` within it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    pub group: Option<String>,
    pub kv_share: Option<f64>,
    pub class: Class,
    pub priority: i32,
}

impl Placement {
    /// A plain request of `class` (no experiment, `priority` 0).
    pub fn of(class: Class) -> Self {
        Placement {
            class,
            ..Placement::default()
        }
    }
}

/// The prompt rule every request meets, whoever built it: not empty, and shorter than one
/// sequence's `context` (a token must fit after it). The preparation stage applies it first,
/// naming the field (`prepare::fit_context`); the engine again for requests made by hand
/// (`Engine::check`).
pub fn prompt_fits(prompt: usize, context: usize) -> Result<(), SubmitError> {
    if prompt == 0 {
        return Err(SubmitError::EmptyPrompt);
    }
    if prompt >= context {
        return Err(SubmitError::PromptTooLong { prompt, context });
    }
    Ok(())
}

/// Whether a group of `members` submitted together (`Engine::submit_group`) is admitted in one
/// step, all or none: it must fit the `seq_slots` at once. A larger group can never run at once;
/// it is accepted whole and its members run as slots free.
pub fn admitted_together(members: usize, seq_slots: usize) -> bool {
    members <= seq_slots
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End-of-generation token or a stop string.
    Stop,
    /// max_tokens or the per-sequence context was reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from another sequence (prefix sharing).
    pub shared_prompt_tokens: usize,
    pub preemptions: u32,
    pub queue_time: Duration,
    pub time_to_first_token: Duration,
    pub total_time: Duration,
    /// Text held back at the end (a partial stop string that never completed, a split character).
    pub tail_text: String,
    /// How a constrained answer ended against its grammar (`None`: unconstrained).
    pub grammar: Option<GrammarOutcome>,
    /// What the answer cost at its model's configured prices (a model served elsewhere with
    /// `input_price`/`output_price`; `None` without prices).
    pub cost: Option<f64>,
}

/// A constrained answer's grammar at its end.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GrammarOutcome {
    /// `json_schema`, `json_object`, `regex` or `lark` (`Grammar::kind`).
    pub kind: &'static str,
    /// The answer is a complete match of the grammar (it may end here).
    pub complete: bool,
    /// Tokens the grammar forced (fast-forward), counted in `completion_tokens` too.
    pub forced_tokens: usize,
}

#[derive(Debug, Clone)]
pub enum Event {
    /// The sequence was admitted (left the queue); `order` counts admissions engine-wide.
    Admitted {
        queue_time: Duration,
        order: u64,
    },
    Token {
        token: i32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done(Completion),
    Error(GenerationError),
}

/// Why an admitted request ended without an answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GenerationError {
    /// Only without admission control (`--unsafe-no-admission-control`): the batch did not fit.
    #[error("out of memory: no free KV cache cells for the batch (admission control is off)")]
    OutOfMemory,
    /// llama.cpp found no room for a sequence that runs alone.
    #[error("no KV cache slot for a single sequence")]
    NoSlot,
    /// `llama_decode` failed.
    #[error("decode failed: {0}")]
    Decode(String),
    /// The engine shut down with the request queued or running.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// The event channel closed before an answer (the engine thread is gone).
    #[error("the engine stopped before the request finished")]
    EngineStopped,
    /// A state the engine must never reach (a bug), named: the request concerned fails, the
    /// engine goes on (or, after a panic, stops with every request failed: `engine_loop`).
    #[error("internal engine error: {0}")]
    Internal(String),
    /// The grammar failed during generation (llguidance's per-step limits).
    #[error("the grammar failed during generation: {0}")]
    Grammar(String),
    /// A model served elsewhere refused the request or failed it; `status` is the HTTP status
    /// abserve answers with (400 refused, 502 a bad answer, 503 unavailable, 504 a timeout) and
    /// `message` names the upstream.
    #[error("{message}")]
    Upstream { status: u16, message: String },
}

impl GenerationError {
    /// A short stable name for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            GenerationError::OutOfMemory => "out_of_memory",
            GenerationError::NoSlot => "no_slot",
            GenerationError::Decode(_) => "decode",
            GenerationError::ShuttingDown => "shutting_down",
            GenerationError::EngineStopped => "engine_stopped",
            GenerationError::Internal(_) => "internal",
            GenerationError::Grammar(_) => "grammar",
            GenerationError::Upstream { .. } => "upstream",
        }
    }
}

pub type EventSender = UnboundedSender<Event>;
pub type EventReceiver = tokio::sync::mpsc::UnboundedReceiver<Event>;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt has {prompt} tokens but one sequence's context is {context} tokens")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the waiting queue is full ({0} requests)")]
    QueueFull(usize),
    /// A group larger than the slots and the queue together: it could never be accepted whole.
    #[error("a group of {group} requests cannot be accepted whole: at most {capacity} ({slots} sequence slots + {queue} queued) are held at once")]
    GroupTooLarge {
        group: usize,
        capacity: usize,
        slots: usize,
        queue: usize,
    },
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("invalid {0}: {1}")]
    Invalid(&'static str, String),
}
