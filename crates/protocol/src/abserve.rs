//! abserve's own bodies beside OpenAI's: `GET /ready` and an experiment's fan-out.
//! Written by the server, read by eval, loadtest and scripts.

use serde::{Deserialize, Serialize};

/// Memory of the process against the plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReadyMemory {
    pub rss_bytes: u64,
    pub budget_bytes: u64,
    pub planned_bytes: u64,
    pub margin_bytes: u64,
}

/// The device layers are offloaded to, read now, beside its part of the plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReadyDevice {
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// In use now, by every process.
    pub used_bytes: u64,
    /// In use before abserve loaded (other processes); `used − used_before` is abserve's.
    pub used_before_bytes: u64,
    pub budget_bytes: u64,
    pub planned_bytes: u64,
}

/// The memory plan's capacity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReadyPlan {
    /// KV cells over all sequences.
    pub kv_cells: u64,
    /// Tokens per sequence (prompt + answer).
    pub context: u64,
    /// Sequences of the whole context that fit at once.
    pub full_context_sequences: u64,
    /// Sequences that may be live at once (llama.cpp's n_seq_max).
    pub seq_slots: u64,
    pub kv_cells_per_slot: u64,
    pub kv_unified: bool,
}

/// `GET /ready` when ready (otherwise a 503 with an OpenAI error body).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Ready {
    pub status: String,
    pub model: String,
    /// The 1-token generation the check ran.
    pub probe_latency_ms: f64,
    pub memory: ReadyMemory,
    pub plan: ReadyPlan,
    pub kv_cells_used: u64,
    pub running: u64,
    pub waiting: u64,
    /// Requests that may wait before the server answers 429.
    pub max_queue: u64,
    /// With layers offloaded: the device's memory and its plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<ReadyDevice>,
}

/// One variant's answer in a fan-out; `error` instead of the rest when it failed or was
/// refused (its daily spend cap), `skipped` when its `fanout_rate` left this input out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FanoutResult {
    pub variant: String,
    /// The id of the model that answered (the variant's `model`, else the default model).
    #[serde(default)]
    pub model: String,
    pub output: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Prompt tokens whose KV was reused (another variant's or a cached prefix).
    pub shared_prompt_tokens: Option<u64>,
    pub ttft_ms: Option<f64>,
    pub latency_ms: Option<f64>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// Order in which the engine admitted the variants (0 = first).
    pub admission_rank: usize,
    /// The tools the variant's answer called (a variant with `tools`; `output` is then the
    /// content besides the calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<crate::ToolCall>>,
    /// A constrained answer (`response_format` or tools) finished as a complete match of its
    /// grammar; absent for a free answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar_complete: Option<bool>,
    /// What the answer cost at its model's prices (a model served elsewhere with prices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Why the variant did not answer this input (its `fanout_rate` sampled it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// `POST /v1/experiments/{name}/fanout`: every variant on one input.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Fanout {
    pub experiment: String,
    pub input: String,
    pub results: Vec<FanoutResult>,
    /// The id every variant's sample of this input shares, when the experiment samples it
    /// (`samples`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_id: Option<String>,
}

/// `POST /v1/experiments/{name}/events`: what was taken.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventsAccepted {
    /// Events in the request.
    pub accepted: usize,
    /// Events written now (0 when the batch id was seen before).
    pub stored: usize,
    /// The `batch_id` was stored before: nothing was counted twice.
    pub duplicate_batch: bool,
}

/// `DELETE` of an object, as OpenAI answers it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Deleted {
    pub id: String,
    pub object: String,
    pub deleted: bool,
}

/// A list, as OpenAI answers `GET` of a collection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct List<T> {
    pub object: String,
    pub data: Vec<T>,
}

impl<T> List<T> {
    pub fn new(data: Vec<T>) -> List<T> {
        List {
            object: "list".into(),
            data,
        }
    }
}

/// `GET /health`: the engine thread is alive.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    pub status: String,
}

/// One server-sent event of a streamed answer (for the OpenAPI document): `data` is a
/// [`Chunk`](crate::wire::Chunk) as JSON, an error body `{"error": ...}`, or `[DONE]` last.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SseEvent {
    pub data: String,
}
