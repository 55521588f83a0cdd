//! A request's [`Structure`] (`response_format`, tools) as the grammar its answer must match,
//! compiled for the model's vocabulary ([`crate::grammar`]); and its `logit_bias` checked
//! against the vocabulary.
//!
//! Limits: at most [`MAX_LOGIT_BIAS`] biased tokens, each bias in [−100, 100]; a grammar within
//! llguidance's limits and the compile budget (`grammar::limits`, `grammar::COMPILE_BUDGET`).

use std::collections::BTreeMap;

use abserve_protocol::{ResponseFormat, Structure};

use super::error::PrepareError;
use super::Tokenizer;
use crate::grammar::{Constraint, Grammar};

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

/// The compiled constraint of a structure (`None`: free text).
pub fn constraint(
    tok: &dyn Tokenizer,
    structure: &Structure,
) -> Result<Option<Constraint>, PrepareError> {
    if structure.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(PrepareError::new(
            "tools",
            "tools are not supported by this server yet",
        ));
    }
    let Some(grammar) = response_grammar(structure.response_format.as_ref()) else {
        return Ok(None);
    };
    let grammars = tok
        .grammars()
        .map_err(|e| PrepareError::new("response_format", e))?;
    grammars.compile(&grammar, "response_format").map(Some)
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
                    format!("logit_bias values must be between -100 and 100, got {v} for token {t}"),
                )
                .beyond("-100 to 100", v));
            }
            Ok((t as i32, v as f32))
        })
        .collect()
}
