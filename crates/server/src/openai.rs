//! OpenAI request bodies, their validation, and the conversion into engine requests.
//!
//! Unknown fields are ignored (clients send many); wrong types and out-of-range values are a
//! 400 naming the parameter, as OpenAI answers them.

use abserve_engine::ChatMessage;
use abserve_engine::SamplingParams;
use serde::Deserialize;

use crate::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Content of a chat message: a string or a list of text parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
}

/// Fields shared by chat and completions.
#[derive(Debug, Deserialize, Default)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub n: Option<i64>,
    pub stop: Option<StopField>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub user: Option<String>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub ignore_eos: bool,
    /// llama.cpp's extension: reuse a cached prompt prefix of finished requests (default: yes
    /// unless `seed` is set).
    pub cache_prompt: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: Common,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: Common,
    pub prompt: PromptField,
    /// Completions API: number of top log-probabilities (0..=5).
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: bool,
}

/// Parses a JSON body into `T`, turning every failure into a 400 that says what is wrong.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!("We could not parse the JSON body of your request: {e}"))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request("The request body must be a JSON object."));
    }
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("Invalid request: {e}")))
}

pub const MAX_N: i64 = 16;

impl Common {
    /// Sampling parameters after range checks. `default_max` applies when neither max_tokens
    /// nor max_completion_tokens is given.
    pub fn sampling(&self, default_max: u32, logprobs: Option<u32>) -> Result<SamplingParams, ApiError> {
        let max = self.max_completion_tokens.or(self.max_tokens);
        let max_tokens = match max {
            None => default_max,
            Some(m) if m >= 1 && m <= u32::MAX as i64 => m as u32,
            Some(m) => {
                let p = if self.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" };
                return Err(ApiError::invalid_param(p, format!("{p} must be at least 1, got {m}")));
            }
        };
        let stop = match &self.stop {
            None => vec![],
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.len() > 4 {
            return Err(ApiError::invalid_param("stop", "stop may hold at most 4 sequences"));
        }
        if stop.iter().any(|s| s.is_empty()) {
            return Err(ApiError::invalid_param("stop", "stop sequences must not be empty"));
        }
        let top_k = match self.top_k {
            None => 0,
            Some(k) if (0..=100_000).contains(&k) => k as u32,
            Some(k) => return Err(ApiError::invalid_param("top_k", format!("top_k must be between 0 and 100000, got {k}"))),
        };
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0) as f32,
            top_k,
            top_p: self.top_p.unwrap_or(1.0) as f32,
            min_p: self.min_p.unwrap_or(0.0) as f32,
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0) as f32,
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0) as f32,
            presence_penalty: self.presence_penalty.unwrap_or(0.0) as f32,
            seed: self.seed.map(|s| s as u64),
            max_tokens,
            stop,
            logprobs,
            ignore_eos: self.ignore_eos,
            cache_prompt: self.cache_prompt,
        };
        p.validate().map_err(|(param, msg)| ApiError::invalid_param(param, msg))?;
        Ok(p)
    }

    pub fn n(&self) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if (1..=MAX_N).contains(&n) => Ok(n as usize),
            Some(n) => Err(ApiError::invalid_param("n", format!("n must be between 1 and {MAX_N}, got {n}"))),
        }
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }
}

pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

impl ChatRequest {
    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param("messages", "messages must contain at least one message"));
        }
        let mut out = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}].role"),
                    format!("'{}' is not a valid role; expected one of {}", m.role, ROLES.join(", ")),
                ));
            }
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut s = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => s.push_str(t),
                            _ => {
                                return Err(ApiError::invalid_param(
                                    &format!("messages[{i}].content[{j}]"),
                                    "only text content parts are supported",
                                ))
                            }
                        }
                    }
                    s
                }
            };
            // system prompts are called "developer" in newer clients; the templates know "system"
            let role = if m.role == "developer" { "system" } else { m.role.as_str() };
            out.push(ChatMessage::new(role, &content));
        }
        Ok(out)
    }

    pub fn top_logprobs(&self) -> Result<Option<u32>, ApiError> {
        match (self.logprobs, self.top_logprobs) {
            (_, Some(n)) if !(0..=20).contains(&n) => {
                Err(ApiError::invalid_param("top_logprobs", format!("top_logprobs must be between 0 and 20, got {n}")))
            }
            (false, Some(_)) => Err(ApiError::invalid_param("top_logprobs", "top_logprobs requires logprobs to be true")),
            (true, n) => Ok(Some(n.unwrap_or(0) as u32)),
            (false, None) => Ok(None),
        }
    }
}

impl CompletionRequest {
    pub fn logprobs(&self) -> Result<Option<u32>, ApiError> {
        match self.logprobs {
            None => Ok(None),
            Some(n) if (0..=5).contains(&n) => Ok(Some(n as u32)),
            Some(n) => Err(ApiError::invalid_param("logprobs", format!("logprobs must be between 0 and 5, got {n}"))),
        }
    }
}
