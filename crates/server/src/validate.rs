//! The one validation stage: OpenAI request bodies (the types are `abserve_protocol::wire`'s),
//! an experiment's variants and a fan-out all pass the same checks, with one limit per
//! parameter, before anything reaches the engine. A variant is checked as the request it will
//! produce, so an experiment that is created can serve. The engine checks only its own
//! invariants (vocabulary, context) on submit.
//!
//! Unknown fields are ignored (clients send many); wrong types and out-of-range values are a
//! 400 naming the parameter, as OpenAI answers them.
//!
//! Limits: `n` ≤ 16, `stop` ≤ 4 non-empty strings, `top_logprobs` ≤ 20 (completions `logprobs`
//! ≤ 5), at most 1024 messages of at most 1 MiB of text together, rendered templates at most
//! 1 MiB and 100,000 template instructions; sampling ranges as OpenAI's (temperature 0–2, top_p
//! in (0, 1], penalties −2–2); `max_tokens` ≥ 1 and within the context.

use abserve_engine::ChatMessage;
use abserve_engine::SamplingParams;
use abserve_protocol::wire::{ChatRequest, Common, CompletionRequest, Content};

use crate::error::ApiError;

/// Parses a JSON body into `T`, turning every failure into a 400 that says what is wrong.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "We could not parse the JSON body of your request: {e}"
        ))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "The request body must be a JSON object.",
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("Invalid request: {e}")))
}

pub const MAX_N: i64 = 16;
pub const MAX_STOP: usize = 4;
pub const MAX_MESSAGES: usize = 1024;
/// Text of all messages together, in bytes (a prompt this long fits no context we serve).
pub const MAX_MESSAGE_BYTES: usize = abserve_ab::MAX_RENDERED_BYTES;

/// Sampling parameters of `c` after range checks. `default_max` applies when neither max_tokens
/// nor max_completion_tokens is given.
pub fn sampling(
    c: &Common,
    default_max: u32,
    logprobs: Option<u32>,
) -> Result<SamplingParams, ApiError> {
    let max = c.max_completion_tokens.or(c.max_tokens);
    let max_tokens = match max {
        None => default_max,
        Some(m) if m >= 1 && m <= u32::MAX as i64 => m as u32,
        Some(m) => {
            let p = if c.max_completion_tokens.is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            return Err(ApiError::invalid_param(
                p,
                format!("{p} must be at least 1, got {m}"),
            ));
        }
    };
    let stop = c.stop.as_ref().map(|s| s.to_vec()).unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(ApiError::invalid_param(
            "stop",
            format!("stop may hold at most {MAX_STOP} sequences"),
        ));
    }
    if stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid_param(
            "stop",
            "stop sequences must not be empty",
        ));
    }
    let top_k = match c.top_k {
        None => 0,
        Some(k) if (0..=100_000).contains(&k) => k as u32,
        Some(k) => {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("top_k must be between 0 and 100000, got {k}"),
            ))
        }
    };
    let p = SamplingParams {
        temperature: c.temperature.unwrap_or(1.0) as f32,
        top_k,
        top_p: c.top_p.unwrap_or(1.0) as f32,
        min_p: c.min_p.unwrap_or(0.0) as f32,
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0) as f32,
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0) as f32,
        presence_penalty: c.presence_penalty.unwrap_or(0.0) as f32,
        seed: c.seed.map(|s| s as u64),
        max_tokens,
        stop,
        logprobs,
        ignore_eos: c.ignore_eos,
        cache_prompt: c.cache_prompt,
    };
    p.validate()
        .map_err(|(param, msg)| ApiError::invalid_param(param, msg))?;
    Ok(p)
}

/// `n`: how many choices (1 by default).
pub fn n(c: &Common) -> Result<usize, ApiError> {
    match c.n {
        None => Ok(1),
        Some(n) if (1..=MAX_N).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid_param(
            "n",
            format!("n must be between 1 and {MAX_N}, got {n}"),
        )),
    }
}

pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The messages of a chat request as the engine's, roles checked, text parts joined.
pub fn messages(r: &ChatRequest) -> Result<Vec<ChatMessage>, ApiError> {
    if r.messages.is_empty() || r.messages.len() > MAX_MESSAGES {
        return Err(ApiError::invalid_param(
            "messages",
            format!(
                "messages must hold between 1 and {MAX_MESSAGES} messages, got {}",
                r.messages.len()
            ),
        ));
    }
    let mut bytes = 0usize;
    let mut out = Vec::with_capacity(r.messages.len());
    for (i, m) in r.messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid_param(
                &format!("messages[{i}].role"),
                format!(
                    "'{}' is not a valid role; expected one of {}",
                    m.role,
                    ROLES.join(", ")
                ),
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
        bytes += content.len();
        if bytes > MAX_MESSAGE_BYTES {
            return Err(ApiError::invalid_param(
                "messages",
                format!("the messages hold more than {MAX_MESSAGE_BYTES} bytes of text"),
            ));
        }
        // system prompts are called "developer" in newer clients; the templates know "system"
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        out.push(ChatMessage::new(role, &content));
    }
    Ok(out)
}

/// Chat `logprobs`/`top_logprobs` as the number of alternatives to report, if any.
pub fn top_logprobs(r: &ChatRequest) -> Result<Option<u32>, ApiError> {
    match (r.logprobs, r.top_logprobs) {
        (_, Some(n)) if !(0..=20).contains(&n) => Err(ApiError::invalid_param(
            "top_logprobs",
            format!("top_logprobs must be between 0 and 20, got {n}"),
        )),
        (false, Some(_)) => Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs requires logprobs to be true",
        )),
        (true, n) => Ok(Some(n.unwrap_or(0) as u32)),
        (false, None) => Ok(None),
    }
}

/// Completions `logprobs` (0..=5 alternatives).
pub fn completion_logprobs(r: &CompletionRequest) -> Result<Option<u32>, ApiError> {
    match r.logprobs {
        None => Ok(None),
        Some(n) if (0..=5).contains(&n) => Ok(Some(n as u32)),
        Some(n) => Err(ApiError::invalid_param(
            "logprobs",
            format!("logprobs must be between 0 and 5, got {n}"),
        )),
    }
}

/// Checks an experiment's variant as the request it will produce: its sampling settings by the
/// rules above, its `max_tokens` within `context`, its template by rendering it (bounded) for a
/// probe input. An experiment is stored only when every variant passes.
pub fn variant(v: &abserve_ab::Variant, context: u64) -> Result<(), ApiError> {
    let at = |e: ApiError| {
        ApiError::invalid_param(
            &format!(
                "variants.{}.{}",
                v.id,
                e.param.as_deref().unwrap_or("template")
            ),
            e.message,
        )
    };
    let s = v.sampling();
    let f = |x: Option<f32>| x.map(f64::from);
    let c = Common {
        temperature: f(s.temperature),
        top_p: f(s.top_p),
        presence_penalty: f(s.presence_penalty),
        frequency_penalty: f(s.frequency_penalty),
        max_tokens: s.max_tokens.map(i64::from),
        stop: s.stop.map(abserve_protocol::wire::Stop::Many),
        ..Default::default()
    };
    sampling(&c, 16, None).map_err(at)?;
    if let Some(m) = s.max_tokens {
        if u64::from(m) >= context {
            let e = ApiError::invalid_param(
                "max_tokens",
                format!(
                    "max_tokens {m} leaves no room for a prompt in the context of {context} tokens"
                ),
            );
            return Err(at(e));
        }
    }
    v.chat_for_input("test input")
        .map_err(|e| at(ApiError::bad_request(e.message)))?;
    Ok(())
}
