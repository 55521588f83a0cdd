//! OpenAI wire types that readers need: streamed chunks, whole chat responses, usage, errors and
//! the model list. Both serialisable and deserialisable; unknown fields are ignored, missing
//! optional ones default, so the same types read abserve, vLLM, llama.cpp's server and OpenAI.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

/// What a chunk adds to a chat message (`delta`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a streamed chunk: chat chunks carry `delta`, completions chunks `text`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    #[serde(default)]
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<Delta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

impl ChunkChoice {
    /// The text this chunk adds, chat or completions alike.
    pub fn content(&self) -> Option<&str> {
        self.delta.as_ref().and_then(|d| d.content.as_deref()).or(self.text.as_deref())
    }
}

/// A streamed `chat.completion.chunk` or `text_completion` chunk, or an error sent in the
/// stream (abserve and vLLM send `{"error": {...}}` when a generation fails mid-stream).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorObject>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    #[serde(default)]
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

impl Choice {
    pub fn content(&self) -> Option<&str> {
        self.message.as_ref().and_then(|m| m.content.as_deref()).or(self.text.as_deref())
    }
}

/// A whole (not streamed) chat or completions response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    #[serde(default)]
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// OpenAI's error object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

/// The body of an error response: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub id: String,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
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
        let t: Chunk = serde_json::from_str(r#"{"choices":[{"index":0,"text":"yo","finish_reason":"length"}]}"#).unwrap();
        assert_eq!((t.choices[0].content(), t.choices[0].finish_reason.as_deref()), (Some("yo"), Some("length")));
        let u: Chunk = serde_json::from_str(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#).unwrap();
        assert_eq!(u.usage.unwrap().completion_tokens, 4);
        let e: Chunk = serde_json::from_str(r#"{"error":{"message":"out of memory","type":"server_error","param":null,"code":null}}"#).unwrap();
        assert_eq!(e.error.unwrap().message, "out of memory");
    }
}
