//! OpenAI response bodies: whole chat and completions responses, streamed chunks, usage,
//! log-probabilities, errors and the model list, plus abserve's `abserve` routing field.
//!
//! The server writes them and abserve's clients read them. Reading: unknown fields are ignored
//! and missing ones default, so the same types read abserve, vLLM, llama.cpp's server and
//! OpenAI. Writing: fields OpenAI always sends (`logprobs`, `finish_reason`) are `null` when
//! empty; fields of the other endpoint (`text` on chat, `delta` on completions) are left out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::structure::{ToolCall, ToolCallDelta};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV entries were reused from an earlier request.
    #[serde(default)]
    pub cached_tokens: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }
}

/// One alternative of chat log-probabilities.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    #[serde(default)]
    pub bytes: Vec<u8>,
}

/// A sampled token of chat log-probabilities, with its alternatives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    #[serde(default)]
    pub bytes: Vec<u8>,
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

/// Chat log-probabilities: `{"content": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

/// Completions log-probabilities: parallel lists.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TextLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

/// Log-probabilities of either endpoint; `Other` keeps a shape another server sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Logprobs {
    Chat(ChatLogprobs),
    Text(TextLogprobs),
    Other(serde_json::Value),
}

/// What a chunk adds to a chat message (`delta`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a streamed chunk: chat chunks carry `delta`, completions chunks `text`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChunkChoice {
    #[serde(default)]
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<Delta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Logprobs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

impl ChunkChoice {
    /// The text this chunk adds, chat or completions alike.
    pub fn content(&self) -> Option<&str> {
        self.delta
            .as_ref()
            .and_then(|d| d.content.as_deref())
            .or(self.text.as_deref())
    }
}

/// A streamed `chat.completion.chunk` or `text_completion` chunk, or an error sent in the
/// stream (abserve and vLLM send `{"error": {...}}` when a generation fails mid-stream).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Chunk {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorObject>,
}

/// The message of a whole chat choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    /// The tools the model called (then `content` is null and `finish_reason` `tool_calls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One choice of a whole response: chat choices carry `message`, completions choices `text`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Choice {
    #[serde(default)]
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<ResponseMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Logprobs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// The prompt's token ids as the engine saw them, when the request asked with
    /// `return_token_ids` (vLLM's name; abserve puts them on each choice, since a completions
    /// request may carry several prompts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<i32>>,
}

impl Choice {
    pub fn content(&self) -> Option<&str> {
        self.message
            .as_ref()
            .and_then(|m| m.content.as_deref())
            .or(self.text.as_deref())
    }
}

/// Where abserve routed a request to `experiment:<name>` (the `abserve` field of a response).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Routing {
    pub experiment: String,
    pub variant: String,
    #[serde(default)]
    pub unit: Option<String>,
    /// The variant was forced by `X-Abserve-Variant`.
    #[serde(default)]
    pub forced: bool,
    /// The request counts in the experiment's results (an exposure was recorded).
    #[serde(default)]
    pub in_experiment: bool,
}

/// A whole (not streamed) `chat.completion` or `text_completion`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Response {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    #[serde(default)]
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abserve: Option<Routing>,
}

/// OpenAI's error object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorObject {
    #[serde(default)]
    pub message: String,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub param: Option<String>,
    #[serde(default)]
    pub code: Option<String>,
}

/// The body of an error response, and an error inside a stream: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Model {
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub owned_by: String,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelList {
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub data: Vec<Model>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_chat_completions_usage_and_error_chunks() {
        let c: Chunk = serde_json::from_str(
            r#"{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}"#,
        )
        .unwrap();
        assert_eq!(c.choices[0].content(), Some("Hi"));
        let t: Chunk = serde_json::from_str(
            r#"{"choices":[{"index":0,"text":"yo","finish_reason":"length"}]}"#,
        )
        .unwrap();
        assert_eq!(
            (
                t.choices[0].content(),
                t.choices[0].finish_reason.as_deref()
            ),
            (Some("yo"), Some("length"))
        );
        let u: Chunk = serde_json::from_str(
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#,
        )
        .unwrap();
        assert_eq!(u.usage.unwrap().completion_tokens, 4);
        let e: Chunk = serde_json::from_str(r#"{"error":{"message":"out of memory","type":"server_error","param":null,"code":null}}"#).unwrap();
        assert_eq!(e.error.unwrap().message, "out of memory");
    }

    #[test]
    fn written_choices_have_openais_nulls_and_only_their_endpoints_fields() {
        let chat = ChunkChoice {
            delta: Some(Delta {
                content: Some("a".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&chat).unwrap(),
            serde_json::json!({"index": 0, "delta": {"content": "a"}, "logprobs": null, "finish_reason": null})
        );
        let text = Choice {
            text: Some("b".into()),
            finish_reason: Some("stop".into()),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&text).unwrap(),
            serde_json::json!({"index": 0, "text": "b", "logprobs": null, "finish_reason": "stop"})
        );
    }

    #[test]
    fn logprobs_of_both_endpoints_and_unknown_shapes_read_back() {
        let chat: Logprobs = serde_json::from_str(
            r#"{"content":[{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[{"token":"b","logprob":-1.0,"bytes":[98]}]}]}"#,
        )
        .unwrap();
        assert!(matches!(&chat, Logprobs::Chat(c) if c.content[0].top_logprobs[0].token == "b"));
        let text: Logprobs = serde_json::from_str(
            r#"{"tokens":["a"],"token_logprobs":[-0.5],"top_logprobs":[{"a":-0.5}],"text_offset":[0]}"#,
        )
        .unwrap();
        assert!(matches!(&text, Logprobs::Text(t) if t.top_logprobs[0]["a"] == -0.5));
        let other: Logprobs = serde_json::from_str(r#"{"content":null}"#).unwrap();
        assert!(matches!(other, Logprobs::Other(_)));
    }
}
