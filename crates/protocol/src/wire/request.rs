//! OpenAI request bodies: `POST /v1/chat/completions` and `POST /v1/completions`.
//!
//! The same structs are read by the server and written by abserve's clients (eval, loadtest).
//! Reading: unknown fields are ignored (clients send many) and values are kept as sent (wide
//! integer and float types), so that the server, not serde, says which value is out of range.
//! Writing: absent options are left out, so a body carries only what its author set.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::inputs::Sampling;
pub use crate::inputs::Stop;
use crate::structure::{Structure, ToolCall};
#[allow(unused_imports)] // used by the schema examples
use serde_json::json;

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Content of a chat message: a string or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// One message of a chat request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// The calls an assistant message made (tool-calling history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message with text content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: Some(Content::Text(content.into())),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// Fields shared by chat and completions requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Common {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// OpenAI's newer name for `max_tokens` (wins when both are set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<i64>,
    /// temperature, top_p, max_tokens, stop, seed, penalties… (one struct everywhere).
    #[serde(flatten)]
    pub sampling: Sampling,
    /// response_format, tools, tool_choice, parallel_tool_calls.
    #[serde(flatten)]
    pub structure: Structure,
    /// The end user; abserve assigns experiment variants by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// OpenAI's free-form string pairs; abserve reads an experiment's `hash_attribute` here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// llama.cpp's and vLLM's extension: keep generating past end-of-sequence tokens.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ignore_eos: bool,
    /// llama.cpp's extension: reuse a cached prompt prefix (default: yes unless `seed` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_prompt: Option<bool>,
    /// vLLM's extension: each choice carries the prompt's token ids (`prompt_token_ids`), as
    /// the engine received them (non-streamed answers).
    #[serde(default, skip_serializing_if = "is_false")]
    pub return_token_ids: bool,
    /// OpenAI's processing tier, read as the request's priority class (`Class::from_tier`):
    /// `auto`/`default` (the route's or experiment's default), `priority`, `flex`, or abserve's
    /// `interactive`, `fanout`, `batch`; anything else is a 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// vLLM's extension: order within the class, lower first (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
}

impl Common {
    /// Whether the streamed answer ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({"model": "default", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}))]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: Common,
    /// 1 to 1024 messages (roles: system, developer, user, assistant, tool).
    #[schema(min_items = 1, max_items = 1024)]
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub logprobs: bool,
    /// 0 to 20; needs `logprobs: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
}

/// `prompt` of a completions request: text, texts, token ids or lists of token ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({"model": "default", "prompt": "Once upon a time", "max_tokens": 4}))]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: Common,
    pub prompt: Prompt,
    /// Completions API: number of top log-probabilities (0..=5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 5)]
    pub logprobs: Option<i64>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub echo: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_request_carries_only_what_was_set_and_reads_back_equal() {
        let r = ChatRequest {
            common: Common {
                model: Some("m".into()),
                sampling: Sampling {
                    max_tokens: Some(8),
                    seed: Some(3),
                    ..Default::default()
                },
                ..Default::default()
            },
            messages: vec![Message::new("user", "hi")],
            ..Default::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"model": "m", "max_tokens": 8, "seed": 3, "messages": [{"role": "user", "content": "hi"}]})
        );
        assert_eq!(serde_json::from_value::<ChatRequest>(v).unwrap(), r);
    }

    #[test]
    fn reads_the_shapes_openai_clients_send() {
        let r: ChatRequest = serde_json::from_str(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null}],
                "stop":"x","stream":true,"stream_options":{"include_usage":true},"metadata":{"team":"t"},"tools":[]}"#,
        )
        .unwrap();
        assert_eq!(r.common.sampling.stop, Some(Stop::One("x".into())));
        assert!(r.common.include_usage());
        assert_eq!(r.common.metadata.unwrap()["team"], "t");
        assert_eq!(r.messages[1].content, None);
        let c: CompletionRequest =
            serde_json::from_str(r#"{"prompt":[[1,2],[3]],"max_tokens":2}"#).unwrap();
        assert_eq!(c.prompt, Prompt::TokenLists(vec![vec![1, 2], vec![3]]));
        let c: CompletionRequest = serde_json::from_str(r#"{"prompt":[1,2]}"#).unwrap();
        assert_eq!(c.prompt, Prompt::Tokens(vec![1, 2]));
    }
}
