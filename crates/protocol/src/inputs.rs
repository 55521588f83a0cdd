//! The inputs of a generation that every layer shares: [`ChatMessage`] (a role and its text) and
//! [`Sampling`], the one set of sampling settings — an OpenAI request's (flattened into
//! [`crate::wire::Common`]), an experiment variant's (converted by `abserve_ab::Variant::sampling`,
//! whose `deny_unknown_fields` forbids flattening), an eval call's (flattened into its job
//! message) and a `generate` prompt line's are all this struct.
//!
//! Values are kept as sent, in wide types (`f64`, `i64`), so that the engine's preparation stage
//! (`abserve_engine::prepare`), not serde, says which value is out of range and why. `None`
//! means "not set": the next layer (a variant over a request, the defaults under both) decides.

use serde::{Deserialize, Serialize};

use crate::structure::ToolCall;

/// `stop`: one string or a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

/// One chat message after validation: a role and its text (content parts joined), and for the
/// tool-calling history the calls an assistant made and the call a `tool` message answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Sampling {
    /// At least 1; prompt + max_tokens must fit the context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub max_tokens: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 100000)]
    pub top_k: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// OpenAI's seed is a signed 64-bit integer; larger seeds keep their bits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(exclusive_minimum = 0.0)]
    pub repetition_penalty: Option<f64>,
    /// OpenAI's `logit_bias`: token id (as a string) → bias in [−100, 100], added to the
    /// token's logit before sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// abserve's extension (llama.cpp's server has `lora`, by id): LoRA adapters of the model
    /// to generate with, as GGUF LoRA files and scales. Only adapters the server was started
    /// with (`--lora`) or files under its `--adapter-dir` may be named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapters: Option<Vec<Adapter>>,
}

/// A LoRA adapter and its scale (`adapters = [{ path = "…", scale = 1.0 }]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Adapter {
    /// The GGUF LoRA file.
    pub path: String,
    /// How much of the adapter to apply (default 1; 0 is the base model).
    #[serde(default = "one")]
    pub scale: f32,
}

fn one() -> f32 {
    1.0
}

impl Sampling {
    /// `over`'s settings where it has them, `self`'s elsewhere (a variant over a request).
    pub fn overlaid(&self, over: &Sampling) -> Sampling {
        fn pick<T: Clone>(base: &Option<T>, over: &Option<T>) -> Option<T> {
            over.clone().or_else(|| base.clone())
        }
        Sampling {
            max_tokens: pick(&self.max_tokens, &over.max_tokens),
            temperature: pick(&self.temperature, &over.temperature),
            top_p: pick(&self.top_p, &over.top_p),
            top_k: pick(&self.top_k, &over.top_k),
            min_p: pick(&self.min_p, &over.min_p),
            stop: pick(&self.stop, &over.stop),
            seed: pick(&self.seed, &over.seed),
            presence_penalty: pick(&self.presence_penalty, &over.presence_penalty),
            frequency_penalty: pick(&self.frequency_penalty, &over.frequency_penalty),
            repetition_penalty: pick(&self.repetition_penalty, &over.repetition_penalty),
            logit_bias: pick(&self.logit_bias, &over.logit_bias),
            adapters: pick(&self.adapters, &over.adapters),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overlay_takes_what_it_sets_and_keeps_the_rest() {
        let req = Sampling {
            temperature: Some(0.2),
            max_tokens: Some(5),
            stop: Some(Stop::One("x".into())),
            ..Default::default()
        };
        let variant = Sampling {
            temperature: Some(0.9),
            seed: Some(-3),
            ..Default::default()
        };
        let s = req.overlaid(&variant);
        assert_eq!(s.temperature, Some(0.9));
        assert_eq!(s.max_tokens, Some(5));
        assert_eq!(s.seed, Some(-3));
        assert_eq!(s.stop, Some(Stop::One("x".into())));
        assert_eq!(
            Sampling::default().overlaid(&Sampling::default()),
            Sampling::default()
        );
    }
}
