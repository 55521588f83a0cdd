//! A request's [`Structure`] (`response_format`, tools) as what the model is told (tools in its
//! template, or the generic format's instructions: [`crate::tools`]) and the grammar its answer
//! must match, compiled for the model's vocabulary ([`crate::grammar`]); and its `logit_bias`
//! checked against the vocabulary.
//!
//! Limits: at most [`MAX_LOGIT_BIAS`] biased tokens, each bias in [−100, 100]; a grammar within
//! llguidance's limits and the compile budget (`grammar::limits`, `grammar::COMPILE_BUDGET`).

use std::collections::BTreeMap;

use std::borrow::Cow;

use abserve_protocol::{ChatMessage, ResponseFormat, Structure, Tool};
use serde_json::json;

use super::Tokenizer;
use crate::grammar::{Constraint, Grammar};
use crate::invalid::PrepareError;
use crate::tools::{tool_use, ToolFormat, ToolUse};

pub const MAX_LOGIT_BIAS: usize = 1024;

/// The grammar `response_format` asks for, if any.
pub fn response_grammar(format: Option<&ResponseFormat>) -> Option<Grammar> {
    match format? {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(Grammar::JsonObject),
        ResponseFormat::JsonSchema { json_schema } => Some(Grammar::JsonSchema(
            json_schema
                .schema
                .clone()
                .unwrap_or_else(|| serde_json::json!({})),
        )),
        ResponseFormat::Regex { regex } => Some(Grammar::Regex(regex.clone())),
        ResponseFormat::Lark { lark } => Some(Grammar::Lark(lark.clone())),
    }
}

/// A chat or prompt after its [`Structure`]: the messages the template renders (the generic
/// tool format adds its instructions and writes earlier calls as its JSON), the tools handed to
/// a template that renders them itself, the grammar of the answer and the field it came from,
/// and how the answer's text becomes tool calls.
pub struct Shaped<'a> {
    pub messages: Cow<'a, [ChatMessage]>,
    pub template_tools: Vec<Tool>,
    pub grammar: Option<(Grammar, &'static str)>,
    pub tools: Option<ToolUse>,
}

/// Shapes `messages` (`None`: a completions prompt, which takes no tools) by `structure`.
pub fn shape<'a>(
    tok: &dyn Tokenizer,
    messages: Option<&'a [ChatMessage]>,
    structure: &Structure,
) -> Result<Shaped<'a>, PrepareError> {
    let format = tok.tool_format();
    let use_ = match messages {
        None if structure.tools.as_ref().is_some_and(|t| !t.is_empty()) => {
            return Err(PrepareError::new(
                "tools",
                "tools apply to chat completions only",
            ))
        }
        None => None,
        Some(_) => tool_use(
            structure.tools.as_deref(),
            structure.tool_choice.as_ref(),
            structure.parallel_tool_calls,
            format,
        )?,
    };
    let response = response_grammar(structure.response_format.as_ref());
    let history = messages.unwrap_or_default();
    let Some(u) = use_ else {
        return Ok(Shaped {
            messages: generic_history(history, format),
            template_tools: Vec::new(),
            grammar: response.map(|g| (g, "response_format")),
            tools: None,
        });
    };
    let response_schema = match response {
        None => None,
        Some(Grammar::JsonObject) if !format.native() => Some(json!({"type": "object"})),
        Some(Grammar::JsonSchema(s)) if !format.native() => Some(s),
        Some(_) => {
            return Err(PrepareError::new(
                "response_format",
                format!(
                    "response_format with tools is supported for JSON in the generic tool format only (this model's is {})",
                    format.name()
                ),
            ))
        }
    };
    let grammar = u.grammar(response_schema).map(|g| (g, "tools"));
    if format.native() {
        return Ok(Shaped {
            messages: Cow::Borrowed(history),
            template_tools: u.tools.clone(),
            grammar,
            tools: Some(u),
        });
    }
    let mut msgs = generic_history(history, format).into_owned();
    let instructions = u.generic_instructions();
    match msgs.first_mut() {
        Some(m) if m.role == "system" => m.content = format!("{}\n\n{instructions}", m.content),
        _ => msgs.insert(0, ChatMessage::new("system", &instructions)),
    }
    Ok(Shaped {
        messages: Cow::Owned(msgs),
        template_tools: Vec::new(),
        grammar,
        tools: Some(u),
    })
}

/// In the generic format, earlier calls are written as the JSON the model answers with (the
/// template knows no `tool_calls`); a template that renders tools takes them as they are.
fn generic_history(history: &[ChatMessage], format: ToolFormat) -> Cow<'_, [ChatMessage]> {
    if format.native() || history.iter().all(|m| m.tool_calls.is_empty()) {
        return Cow::Borrowed(history);
    }
    let rewritten = history
        .iter()
        .map(|m| {
            if m.tool_calls.is_empty() {
                return m.clone();
            }
            let calls: Vec<serde_json::Value> = m
                .tool_calls
                .iter()
                .map(|c| {
                    let args = serde_json::from_str(&c.function.arguments).unwrap_or_else(|_| {
                        serde_json::Value::String(c.function.arguments.clone())
                    });
                    json!({"name": c.function.name, "arguments": args})
                })
                .collect();
            ChatMessage::new(&m.role, &json!({ "tool_calls": calls }).to_string())
        })
        .collect();
    Cow::Owned(rewritten)
}

/// The compiled constraint of a shaped input (`None`: free text).
pub fn constraint(
    tok: &dyn Tokenizer,
    grammar: Option<&(Grammar, &'static str)>,
) -> Result<Option<Constraint>, PrepareError> {
    let Some((grammar, field)) = grammar else {
        return Ok(None);
    };
    let grammars = tok.grammars().map_err(|e| PrepareError::new(*field, e))?;
    grammars.compile(grammar, field).map(Some)
}

/// `logit_bias` as (token, bias) pairs: ids within the vocabulary, biases in [−100, 100].
pub fn logit_bias(
    bias: Option<&BTreeMap<String, f64>>,
    n_vocab: usize,
) -> Result<Vec<(i32, f32)>, PrepareError> {
    let Some(bias) = bias else {
        return Ok(Vec::new());
    };
    if bias.len() > MAX_LOGIT_BIAS {
        return Err(PrepareError::new(
            "logit_bias",
            format!("logit_bias may hold at most {MAX_LOGIT_BIAS} tokens"),
        )
        .beyond(MAX_LOGIT_BIAS, bias.len()));
    }
    bias.iter()
        .map(|(k, &v)| {
            let t: i64 = k.trim().parse().map_err(|_| {
                PrepareError::new(
                    "logit_bias",
                    format!("logit_bias keys are token ids; '{k}' is not an integer"),
                )
            })?;
            if !(0..n_vocab as i64).contains(&t) {
                return Err(PrepareError::new(
                    "logit_bias",
                    format!("token id {t} is outside the vocabulary of {n_vocab}"),
                )
                .beyond(format!("0 to {}", n_vocab - 1), t));
            }
            if !(v.is_finite() && (-100.0..=100.0).contains(&v)) {
                return Err(PrepareError::new(
                    "logit_bias",
                    format!(
                        "logit_bias values must be between -100 and 100, got {v} for token {t}"
                    ),
                )
                .beyond("-100 to 100", v));
            }
            Ok((t as i32, v as f32))
        })
        .collect()
}
