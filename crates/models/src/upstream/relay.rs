//! What an answer being relayed has sent so far ([`Relay`]), and the pieces both protocols'
//! streams end with: tool calls written as abserve's parser reads them back, and the completion.

use std::time::{Duration, Instant};

use abserve_engine::{Completion, Event, FinishReason};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedSender;

/// What went to the client so far.
pub(crate) struct Relay<'a> {
    tx: &'a UnboundedSender<Event>,
    /// Text reached the client: no retry after this.
    pub sent: bool,
    pub ttft: Option<Duration>,
    started: Instant,
}

impl<'a> Relay<'a> {
    pub fn new(tx: &'a UnboundedSender<Event>, started: Instant) -> Relay<'a> {
        Relay {
            tx,
            sent: false,
            ttft: None,
            started,
        }
    }

    /// Output began that is not text (a tool call being written): its first token's time, and
    /// no retry from now on.
    pub fn output_began(&mut self) {
        let at = self.started.elapsed();
        self.ttft.get_or_insert(at);
        self.sent = true;
    }

    /// An event as it is (the tool calls of an answer, at its end).
    pub fn raw(&self, ev: Event) {
        let _ = self.tx.send(ev);
    }

    pub fn text(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        self.ttft.get_or_insert_with(|| self.started.elapsed());
        self.sent = true;
        let _ = self.tx.send(Event::Token {
            token: -1,
            text: t.to_string(),
            logprob: None,
        });
    }
}

/// A tool call assembled from its deltas.
#[derive(Default, Clone)]
pub(crate) struct CallParts {
    pub name: String,
    pub arguments: String,
}

/// The tool calls of an answer as the Hermes format writes them (the form abserve's tool-call
/// parser reads back into OpenAI's `tool_calls`).
pub(crate) fn hermes(calls: &[CallParts]) -> String {
    calls
        .iter()
        .map(|c| {
            let args: Value =
                serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!(c.arguments));
            format!(
                "<tool_call>\n{}\n</tool_call>",
                json!({"name": c.name, "arguments": args})
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Usage and completion of an answer, once it ended.
pub(crate) fn completion(
    finish: FinishReason,
    prompt: usize,
    completion_tokens: usize,
) -> Completion {
    Completion {
        finish_reason: finish,
        prompt_tokens: prompt,
        completion_tokens,
        shared_prompt_tokens: 0,
        preemptions: 0,
        queue_time: Duration::ZERO,
        time_to_first_token: Duration::ZERO,
        total_time: Duration::ZERO,
        tail_text: String::new(),
        grammar: None,
        cost: None,
    }
}

/// The upstream's own words for a refusal (`error.message`, else the body's start).
pub(crate) fn refusal_text(body: &str) -> String {
    let v: Option<Value> = serde_json::from_str(body).ok();
    let m = v.as_ref().and_then(|v| {
        v["error"]["message"]
            .as_str()
            .or_else(|| v["error"].as_str())
            .or_else(|| v["message"].as_str())
    });
    let m = m
        .map(String::from)
        .unwrap_or_else(|| body.chars().take(300).collect());
    m.trim().to_string()
}
