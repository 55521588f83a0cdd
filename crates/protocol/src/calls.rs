//! A chat call and what comes of it: what `abserve eval` asks of a target — the engine in its
//! own process, a worker through the job queue ([`crate::jobs`]), or any OpenAI-compatible URL —
//! and what it gets back. Every target prepares a [`Call`] the same way (the engine's
//! preparation stage, `abserve_engine::prepare`; over HTTP the server does it).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::inputs::{ChatMessage, Sampling};
use crate::structure::Structure;

/// `max_tokens` of a call whose variant sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 256;

/// One chat request of a variant for a row: the same messages and [`Sampling`] on every target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: Sampling,
    /// `response_format` and tools (the variant's).
    #[serde(flatten)]
    pub structure: Structure,
    /// The model to call, by id, when the variant names one (`model = "ID"`); none: the
    /// target's model. An engine in process serves one model and refuses a named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The text eval scores for an answer that called tools, the same on every target: its calls as
/// the generic tool format writes them, `{"tool_calls": [{"name": …, "arguments": {…}}]}`.
pub fn tool_calls_text(calls: &[(String, String)]) -> String {
    let calls: Vec<serde_json::Value> = calls
        .iter()
        .map(|(name, args)| {
            let args = serde_json::from_str(args)
                .unwrap_or_else(|_| serde_json::Value::String(args.clone()));
            serde_json::json!({"name": name, "arguments": args})
        })
        .collect();
    serde_json::json!({ "tool_calls": calls }).to_string()
}

/// A finished answer with its token counts and timings (time to first token measured by
/// streaming over HTTP).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Generation {
    pub text: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub ttft: Duration,
    pub latency: Duration,
    pub finish_reason: String,
}

/// Why a call has no answer, by what the caller should do about it.
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
