//! Anthropic's Messages API (`POST /v1/messages`), translated both ways: OpenAI's chat request
//! (as abserve validated it) becomes a Messages request — system messages as `system`, tool
//! calls and results as `tool_use` and `tool_result` blocks, tools with their `input_schema` —
//! and its streamed events (`message_start`, `content_block_*`, `message_delta`) become engine
//! events, with the usage it reports. A field the Messages API has no place for is refused with
//! its name, never dropped.

use abserve_engine::{Completion, Event, FinishReason};
use serde_json::{json, Map, Value};

use super::relay::{completion, hermes, CallParts, Relay};

/// `max_tokens` of a Messages request whose chat left it unset.
pub const DEFAULT_MAX_TOKENS: u32 = 1024;

/// The Messages request for an OpenAI-style `body` (`messages`, `max_tokens` and the sampling
/// and tool fields abserve accepted).
pub(crate) fn request(model: &str, body: &Map<String, Value>) -> Result<Value, String> {
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    out.insert("stream".into(), json!(true));
    let (system, messages) = conversation(body);
    // the Messages API requires max_tokens: where abserve left it to the upstream (a context
    // nobody said), this is Anthropic's own documented example value
    out.insert("max_tokens".into(), json!(DEFAULT_MAX_TOKENS));
    if !system.is_empty() {
        out.insert("system".into(), json!(system.join("\n\n")));
    }
    out.insert("messages".into(), Value::Array(messages));
    for (k, v) in body {
        match k.as_str() {
            "messages" => {}
            "max_tokens" | "temperature" | "top_p" | "top_k" => {
                out.insert(k.clone(), v.clone());
            }
            "stop" => {
                let s = match v {
                    Value::String(s) => json!([s]),
                    v => v.clone(),
                };
                out.insert("stop_sequences".into(), s);
            }
            "tools" => {
                let tools: Vec<Value> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        let f = &t["function"];
                        let mut o = json!({"name": f["name"], "input_schema": f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}))});
                        if let Some(d) = f.get("description").filter(|d| d.is_string()) {
                            o["description"] = d.clone();
                        }
                        o
                    })
                    .collect();
                out.insert("tools".into(), Value::Array(tools));
            }
            "tool_choice" => {
                let c = match v {
                    Value::String(s) if s == "auto" => json!({"type": "auto"}),
                    Value::String(s) if s == "required" => json!({"type": "any"}),
                    Value::String(s) if s == "none" => json!({"type": "none"}),
                    o => json!({"type": "tool", "name": o["function"]["name"]}),
                };
                out.insert("tool_choice".into(), c);
            }
            "parallel_tool_calls" => {}
            other => {
                return Err(format!(
                    "`{other}` has no place in Anthropic's Messages API, which this upstream speaks"
                ))
            }
        }
    }
    if let (Some(false), Some(tc)) = (
        body.get("parallel_tool_calls").and_then(Value::as_bool),
        out.get_mut("tool_choice"),
    ) {
        tc["disable_parallel_tool_use"] = json!(true);
    }
    Ok(Value::Object(out))
}

/// The system prompt and the Messages form of a chat's messages.
fn conversation(body: &Map<String, Value>) -> (Vec<String>, Vec<Value>) {
    let mut system: Vec<String> = vec![];
    let mut messages: Vec<Value> = vec![];
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let content = m["content"].as_str().unwrap_or("");
        match m["role"].as_str().unwrap_or("") {
            "system" | "developer" => system.push(content.to_string()),
            "tool" => messages.push(json!({"role": "user", "content": [{
                "type": "tool_result",
                "tool_use_id": m["tool_call_id"].as_str().unwrap_or(""),
                "content": content,
            }]})),
            "assistant" if m.get("tool_calls").is_some_and(|t| t.is_array()) => {
                let mut blocks = vec![];
                if !content.is_empty() {
                    blocks.push(json!({"type": "text", "text": content}));
                }
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    let args = c["function"]["arguments"].as_str().unwrap_or("{}");
                    let input: Value = serde_json::from_str(args).unwrap_or_else(|_| json!({}));
                    blocks.push(json!({"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": input}));
                }
                messages.push(json!({"role": "assistant", "content": blocks}));
            }
            role => messages.push(json!({"role": role, "content": content})),
        }
    }
    (system, messages)
}

/// A Messages stream being read.
#[derive(Default)]
pub(crate) struct StreamState {
    input_tokens: usize,
    cached_tokens: usize,
    output_tokens: usize,
    stop: Option<String>,
    /// Tool-use blocks by their index among the content blocks.
    calls: Vec<(usize, CallParts)>,
    ended: bool,
}

impl StreamState {
    pub(crate) fn data(&mut self, d: &str, relay: &mut Relay<'_>) -> Result<(), String> {
        let v: Value =
            serde_json::from_str(d).map_err(|e| format!("an event is not JSON ({e})"))?;
        let n = |v: &Value| v.as_u64().unwrap_or(0) as usize;
        match v["type"].as_str().unwrap_or("") {
            "message_start" => {
                let u = &v["message"]["usage"];
                self.input_tokens = n(&u["input_tokens"]);
                self.cached_tokens = n(&u["cache_read_input_tokens"]);
                self.input_tokens += self.cached_tokens + n(&u["cache_creation_input_tokens"]);
                self.output_tokens = n(&u["output_tokens"]);
            }
            "content_block_start" => {
                let b = &v["content_block"];
                if b["type"] == "tool_use" {
                    let parts = CallParts {
                        name: b["name"].as_str().unwrap_or("").to_string(),
                        arguments: String::new(),
                    };
                    self.calls.push((n(&v["index"]), parts));
                } else if let Some(t) = b["text"].as_str() {
                    relay.text(t);
                }
            }
            "content_block_delta" => {
                let d = &v["delta"];
                match d["type"].as_str().unwrap_or("") {
                    "text_delta" => relay.text(d["text"].as_str().unwrap_or("")),
                    "input_json_delta" => {
                        let i = n(&v["index"]);
                        if let Some((_, c)) = self.calls.iter_mut().find(|(j, _)| *j == i) {
                            c.arguments
                                .push_str(d["partial_json"].as_str().unwrap_or(""));
                        }
                        relay.output_began();
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(s) = v["delta"]["stop_reason"].as_str() {
                    self.stop = Some(s.to_string());
                }
                if let Some(o) = v["usage"]["output_tokens"].as_u64() {
                    self.output_tokens = o as usize;
                }
            }
            "message_stop" => self.ended = true,
            "error" => {
                return Err(format!(
                    "an error in the stream: {}",
                    v["error"]["message"].as_str().unwrap_or("unknown")
                ))
            }
            _ => {}
        }
        Ok(())
    }

    pub(crate) fn finish(&mut self, relay: &mut Relay<'_>) -> Result<Completion, String> {
        if !self.ended && self.stop.is_none() {
            return Err("closed its stream before the answer's end".into());
        }
        if !self.calls.is_empty() {
            let calls: Vec<CallParts> = self.calls.iter().map(|(_, c)| c.clone()).collect();
            relay.raw(Event::Token {
                token: -1,
                text: hermes(&calls),
                logprob: None,
            });
        }
        let finish = match self.stop.as_deref() {
            Some("max_tokens") => FinishReason::Length,
            _ => FinishReason::Stop,
        };
        let mut done = completion(finish, self.input_tokens, self.output_tokens);
        done.shared_prompt_tokens = self.cached_tokens;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_becomes_a_messages_request() {
        let body = json!({
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
            ],
            "max_tokens": 20, "temperature": 0.5, "stop": "END",
            "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
            "tool_choice": "required"
        });
        let r = request("claude", body.as_object().unwrap()).unwrap();
        assert_eq!(r["system"], "be brief");
        assert_eq!(r["messages"].as_array().unwrap().len(), 3);
        assert_eq!(r["messages"][1]["content"][0]["input"]["city"], "Oslo");
        assert_eq!(r["messages"][2]["content"][0]["type"], "tool_result");
        assert_eq!(r["stop_sequences"], json!(["END"]));
        assert_eq!(r["tools"][0]["input_schema"]["type"], "object");
        assert_eq!(r["tool_choice"]["type"], "any");
        let bad = json!({"messages": [], "max_tokens": 5, "seed": 3});
        let e = request("claude", bad.as_object().unwrap()).unwrap_err();
        assert!(e.contains("seed"), "{e}");
    }
}
