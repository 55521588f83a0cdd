//! OpenAI's rules for a request body that do not depend on the model: the messages (roles, text
//! parts, sizes, a `tool` message answering an earlier call), `n`, the log-probability options
//! and a completions prompt's shape. They are the server's (the engine takes messages, prompts
//! and sampling, not OpenAI's body).
//!
//! Limits: `n` ≤ [`MAX_N`], at most [`MAX_MESSAGES`] messages of at most [`MAX_MESSAGE_BYTES`]
//! of text together, `top_logprobs` ≤ 20 (completions `logprobs` ≤ 5), at most
//! [`MAX_COMPLETIONS`] completions per request (prompts × n).

use abserve_engine::prepare::{Input, PrepareError};
use abserve_engine::Class;
use abserve_protocol::wire::{ChatRequest, CompletionRequest, Content, Prompt};
use abserve_protocol::ChatMessage;

use crate::error::ApiError;

pub const MAX_N: i64 = 16;
pub const MAX_MESSAGES: usize = 1024;
/// Text of all messages together, in bytes (a prompt this long fits no context we serve).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Sequences one completions request may ask for (prompts × n).
pub const MAX_COMPLETIONS: usize = 64;
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// `n`: how many choices (1 by default).
pub fn n_choices(n: Option<i64>) -> Result<usize, PrepareError> {
    match n {
        None => Ok(1),
        Some(n) if (1..=MAX_N).contains(&n) => Ok(n as usize),
        Some(n) => Err(
            PrepareError::new("n", format!("n must be between 1 and {MAX_N}, got {n}"))
                .beyond(format!("1 to {MAX_N}"), n),
        ),
    }
}

/// The messages of a chat request as the engine's, roles checked, text parts joined.
pub fn chat_messages(r: &ChatRequest) -> Result<Vec<ChatMessage>, PrepareError> {
    if r.messages.is_empty() || r.messages.len() > MAX_MESSAGES {
        return Err(PrepareError::new(
            "messages",
            format!(
                "messages must hold between 1 and {MAX_MESSAGES} messages, got {}",
                r.messages.len()
            ),
        )
        .beyond(format!("1 to {MAX_MESSAGES}"), r.messages.len()));
    }
    let mut bytes = 0usize;
    let mut out = Vec::with_capacity(r.messages.len());
    for (i, m) in r.messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(PrepareError::new(
                format!("messages[{i}].role"),
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
                            return Err(PrepareError::new(
                                format!("messages[{i}].content[{j}]"),
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
            return Err(PrepareError::new(
                "messages",
                format!("the messages hold more than {MAX_MESSAGE_BYTES} bytes of text"),
            )
            .beyond(MAX_MESSAGE_BYTES, bytes));
        }
        // system prompts are called "developer" in newer clients; the templates know "system"
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        let mut msg = ChatMessage::new(role, &content);
        if let Some(calls) = &m.tool_calls {
            if m.role != "assistant" {
                return Err(PrepareError::new(
                    format!("messages[{i}].tool_calls"),
                    "only assistant messages carry tool_calls",
                ));
            }
            msg.tool_calls = calls.clone();
        }
        if m.role == "tool" {
            answered_call(&out, i, m.tool_call_id.as_deref())?;
        }
        msg.tool_call_id = m.tool_call_id.clone();
        out.push(msg);
    }
    Ok(out)
}

/// OpenAI's rule for a `tool` message (the `i`th, after `before`): it carries a
/// `tool_call_id`, it follows an assistant message with `tool_calls` (other tool messages may
/// come between), and it answers one of those calls.
fn answered_call(before: &[ChatMessage], i: usize, id: Option<&str>) -> Result<(), PrepareError> {
    let Some(id) = id.filter(|id| !id.is_empty()) else {
        return Err(PrepareError::new(
            format!("messages[{i}].tool_call_id"),
            format!("missing required parameter: 'messages[{i}].tool_call_id'"),
        ));
    };
    let calls = before
        .iter()
        .rev()
        .find(|m| m.role != "tool")
        .filter(|m| m.role == "assistant" && !m.tool_calls.is_empty())
        .map(|m| &m.tool_calls);
    let Some(calls) = calls else {
        return Err(PrepareError::new(
            format!("messages[{i}].role"),
            "messages with role 'tool' must be a response to a preceding message with 'tool_calls'",
        ));
    };
    if !calls.iter().any(|c| c.id == id) {
        return Err(PrepareError::new(
            format!("messages[{i}].tool_call_id"),
            format!("'tool_call_id' of '{id}' is not found in the 'tool_calls' of the preceding assistant message"),
        ));
    }
    Ok(())
}

/// Chat `logprobs`/`top_logprobs` as the number of alternatives to report, if any.
pub fn chat_logprobs(r: &ChatRequest) -> Result<Option<u32>, PrepareError> {
    match (r.logprobs, r.top_logprobs) {
        (_, Some(n)) if !(0..=20).contains(&n) => Err(PrepareError::new(
            "top_logprobs",
            format!("top_logprobs must be between 0 and 20, got {n}"),
        )
        .beyond("0 to 20", n)),
        (false, Some(_)) => Err(PrepareError::new(
            "top_logprobs",
            "top_logprobs requires logprobs to be true",
        )),
        (true, n) => Ok(Some(n.unwrap_or(0) as u32)),
        (false, None) => Ok(None),
    }
}

/// Completions `logprobs` (0..=5 alternatives).
pub fn completion_logprobs(r: &CompletionRequest) -> Result<Option<u32>, PrepareError> {
    match r.logprobs {
        None => Ok(None),
        Some(n) if (0..=5).contains(&n) => Ok(Some(n as u32)),
        Some(n) => Err(PrepareError::new(
            "logprobs",
            format!("logprobs must be between 0 and 5, got {n}"),
        )
        .beyond("0 to 5", n)),
    }
}

/// A completions prompt as one or more inputs: texts or token-id lists (ids checked against a
/// vocabulary of `n_vocab`), never an empty list, and with `n` at most [`MAX_COMPLETIONS`]
/// sequences; `echo` is refused (the prompt is not repeated in the answer).
pub fn completion_prompts(
    r: &CompletionRequest,
    n: usize,
    n_vocab: Option<usize>,
) -> Result<Vec<PromptInput>, PrepareError> {
    if r.echo {
        // it used to be accepted and ignored; a client that asks for its prompt back must know
        return Err(PrepareError::new(
            "echo",
            "echo is not supported; the prompt is not repeated in the answer",
        ));
    }
    let ids = |ids: &[i64]| -> Result<PromptInput, PrepareError> {
        // token ids mean something only to a vocabulary this process holds
        let Some(vocab) = n_vocab.map(|n| n as i64) else {
            return Err(PrepareError::new(
                "prompt",
                "this model tokenizes elsewhere: give the prompt as text",
            ));
        };
        ids.iter()
            .map(|&t| {
                if (0..vocab).contains(&t) {
                    Ok(t as i32)
                } else {
                    Err(PrepareError::new(
                        "prompt",
                        format!("token id {t} is outside the vocabulary of {vocab}"),
                    )
                    .beyond(format!("0 to {}", vocab - 1), t))
                }
            })
            .collect::<Result<_, _>>()
            .map(PromptInput::Tokens)
    };
    let inputs: Vec<PromptInput> = match &r.prompt {
        Prompt::Text(s) => vec![PromptInput::Text(s.clone())],
        Prompt::Texts(v) if !v.is_empty() => v.iter().cloned().map(PromptInput::Text).collect(),
        Prompt::Tokens(t) => vec![ids(t)?],
        Prompt::TokenLists(l) if !l.is_empty() => {
            l.iter().map(|t| ids(t)).collect::<Result<_, _>>()?
        }
        _ => {
            return Err(PrepareError::new(
                "prompt",
                "prompt must not be an empty list",
            ))
        }
    };
    if inputs.len() * n > MAX_COMPLETIONS {
        return Err(PrepareError::new(
            "prompt",
            format!("at most {MAX_COMPLETIONS} completions per request (prompts × n)"),
        )
        .beyond(MAX_COMPLETIONS, inputs.len() * n));
    }
    Ok(inputs)
}

/// One prompt of a completions request.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<i32>),
}

/// Fields of OpenAI's API (and of vLLM's and llama.cpp's servers) that change what the answer
/// must be and that abserve does not implement, with what to use instead. A request that sets
/// one gets a 400 naming it instead of an answer that silently ignores it. (Fields that do not
/// change the answer — `store`, `prompt_cache_key`, `safety_identifier` — are accepted and
/// ignored; `service_tier` and `priority` choose the request's priority class: [`placement_of`].)
pub const UNSUPPORTED: &[(&str, &str)] = &[
    ("functions", "use tools"),
    ("function_call", "use tool_choice"),
    ("audio", "abserve answers in text only"),
    ("prediction", "predicted outputs are not supported"),
    ("web_search_options", "web search is not supported"),
    ("reasoning_effort", "the served models do not reason"),
    ("verbosity", "verbosity is not supported"),
    ("suffix", "insertion (suffix) is not supported"),
    ("use_beam_search", "beam search is not supported"),
    ("length_penalty", "beam search is not supported"),
    ("min_tokens", "min_tokens is not supported"),
    ("typical_p", "typical sampling is not supported"),
    ("mirostat", "mirostat sampling is not supported"),
    ("guided_json", "use response_format {type: json_schema}"),
    ("guided_regex", "use response_format {type: regex}"),
    ("guided_grammar", "use response_format {type: lark}"),
    (
        "guided_choice",
        "use response_format {type: json_schema} with an enum",
    ),
    (
        "guided_decoding_backend",
        "abserve always decodes with llguidance",
    ),
    ("structured_outputs", "use response_format"),
    (
        "grammar",
        "use response_format {type: lark} (GBNF is not supported)",
    ),
    ("json_schema", "use response_format {type: json_schema}"),
    ("lora", "LoRA adapters are not supported yet"),
];

/// The priority class and vLLM's `priority` a request asks for with `service_tier` (OpenAI's
/// tiers or abserve's class names, `Class::from_tier`) and `priority`, else `default` (its
/// experiment's class, else its route's) and 0; an unknown tier or a `priority` outside 32 bits
/// is a 400 naming the field.
pub fn placement_of(
    tier: Option<&str>,
    priority: Option<i64>,
    default: Class,
) -> Result<(Class, i32), PrepareError> {
    let class = match tier.map(Class::from_tier).transpose() {
        Ok(asked) => asked.flatten().unwrap_or(default),
        Err(why) => return Err(PrepareError::new("service_tier", why)),
    };
    let priority =
        match priority.map(i32::try_from).transpose() {
            Ok(p) => p.unwrap_or(0),
            Err(_) => return Err(PrepareError::new(
                "priority",
                "priority must be an integer between -2147483648 and 2147483647 (lower runs first)",
            )),
        };
    Ok((class, priority))
}

/// A 400 for the first field of `body` that abserve cannot honour (see [`UNSUPPORTED`]):
/// `modalities` other than text, `best_of` above 1, and every field listed there.
pub fn unsupported_fields(
    body: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), PrepareError> {
    use serde_json::Value;
    for (name, instead) in UNSUPPORTED {
        match body.get(*name) {
            None | Some(Value::Null) => {}
            Some(_) => {
                return Err(PrepareError::new(
                    *name,
                    format!("{name} is not supported by this server: {instead}"),
                ))
            }
        }
    }
    match body.get("modalities") {
        None | Some(Value::Null) => {}
        Some(Value::Array(m)) if m.iter().all(|v| v == "text") => {}
        Some(_) => {
            return Err(PrepareError::new(
                "modalities",
                "abserve answers in text only: modalities may only be [\"text\"]",
            ))
        }
    }
    match body.get("best_of") {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v.as_i64() == Some(1) => Ok(()),
        Some(v) => Err(PrepareError::new(
            "best_of",
            format!("best_of is not supported (only 1), got {v}"),
        )),
    }
}

impl<'a> From<&'a PromptInput> for Input<'a> {
    fn from(p: &'a PromptInput) -> Input<'a> {
        match p {
            PromptInput::Text(t) => Input::Text(t),
            PromptInput::Tokens(t) => Input::Tokens(t),
        }
    }
}

/// Parses an OpenAI request body (chat or completions) as `crate::body::parse_body` does, refusing every
/// field abserve cannot honour ([`UNSUPPORTED`]) with a 400 naming it.
pub fn parse_openai<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    crate::body::parse_checked(bytes, |body| Ok(unsupported_fields(body)?))
}
