//! An OpenAI chat-completions stream read chunk by chunk: content relayed as it arrives, tool
//! calls assembled from their deltas, the usage of its last chunk (`stream_options`).

use abserve_engine::{Completion, Event, FinishReason};
use serde_json::{json, Value};

use super::relay::{completion, hermes, CallParts, Relay};

/// An OpenAI chat-completions stream being read.
#[derive(Default)]
pub(crate) struct OpenaiStream {
    finish: Option<String>,
    usage: Option<(usize, usize, usize)>,
    calls: Vec<CallParts>,
    pieces: usize,
}

impl OpenaiStream {
    pub(crate) fn data(&mut self, d: &str, relay: &mut Relay<'_>) -> Result<(), String> {
        let v: Value = serde_json::from_str(d).map_err(|e| format!("a chunk is not JSON ({e})"))?;
        if let Some(e) = v.get("error") {
            return Err(format!(
                "an error in the stream: {}",
                super::relay::refusal_text(&json!({"error": e}).to_string())
            ));
        }
        if !v.is_object() {
            return Err("a chunk is not an object".into());
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            let n = |k: &str| u[k].as_u64().unwrap_or(0) as usize;
            let cached = u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0) as usize;
            self.usage = Some((n("prompt_tokens"), n("completion_tokens"), cached));
        }
        for c in v["choices"].as_array().into_iter().flatten() {
            if c["index"].as_u64().unwrap_or(0) != 0 {
                continue;
            }
            if let Some(t) = c["delta"]["content"].as_str() {
                if !t.is_empty() {
                    self.pieces += 1;
                }
                relay.text(t);
            }
            for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let i = tc["index"].as_u64().unwrap_or(0) as usize;
                if i >= 128 {
                    return Err("a tool call index beyond 128".into());
                }
                if self.calls.len() <= i {
                    self.calls.resize(i + 1, CallParts::default());
                }
                if let Some(n) = tc["function"]["name"].as_str() {
                    self.calls[i].name.push_str(n);
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    self.calls[i].arguments.push_str(a);
                }
                relay.output_began();
            }
            if let Some(f) = c["finish_reason"].as_str() {
                self.finish = Some(f.to_string());
            }
        }
        Ok(())
    }

    pub(crate) fn finish(&mut self, relay: &mut Relay<'_>) -> Result<Completion, String> {
        let Some(f) = self.finish.clone() else {
            return Err("closed its stream before the answer's end".into());
        };
        if !self.calls.is_empty() {
            let text = hermes(&self.calls);
            relay.raw(Event::Token {
                token: -1,
                text,
                logprob: None,
            });
        }
        let finish = if f == "length" {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let (p, c, cached) = self.usage.unwrap_or((0, self.pieces, 0));
        let mut done = completion(finish, p, c);
        done.shared_prompt_tokens = cached;
        Ok(done)
    }
}
