//! One variant API: what a variant does to a request — its messages (system prompt and user
//! template), its sampling settings and the structure of its answer (`response_format`, tools). The server's chat and completions routes, its fan-out
//! and `abserve eval` all go through here (then through the engine's one preparation stage,
//! `abserve_engine::prepare`), so a variant means the same thing everywhere.

use abserve_protocol::wire::Stop;
use abserve_protocol::{ChatMessage as Message, Sampling, Structure};
use serde_json::Value;

use crate::experiment::{render, render_row, Variant};

/// A template that does not render for this input, with the variant named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("variant '{variant}': {message}")]
pub struct VariantError {
    pub variant: String,
    pub message: String,
}

/// A request's prompt: a conversation (chat, fan-out) or a completions prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Chat(Vec<Message>),
    Text(String),
}

/// What a request asks of a model: its prompt, sampling settings and answer structure — as the
/// client sent it, or as a variant sends it ([`Variant::apply`]).
#[derive(Debug, Clone)]
pub struct Asked {
    pub prompt: Prompt,
    pub sampling: Sampling,
    pub structure: Structure,
}

impl Variant {
    /// Whether this variant answers fan-out input `input` of an experiment hashed by `seed`
    /// (its `fanout_rate`; see `fanout.rs`).
    pub fn fans_out(&self, seed: &str, input: &str) -> bool {
        crate::fanout::sampled(seed, &self.id, self.fanout_rate, input)
    }

    fn err(&self, message: String) -> VariantError {
        VariantError {
            variant: self.id.clone(),
            message,
        }
    }

    /// The variant's sampling settings as the one [`Sampling`] struct (the variant's own
    /// fields stay, since `deny_unknown_fields` forbids flattening: this is the one conversion).
    pub fn sampling(&self) -> Sampling {
        let f = |x: Option<f32>| x.map(f64::from);
        Sampling {
            temperature: f(self.temperature),
            top_p: f(self.top_p),
            max_tokens: self.max_tokens.map(i64::from),
            // OpenAI's seed is signed; a seed above i64::MAX keeps its bits
            seed: self.seed.map(|s| s as i64),
            stop: self.stop.clone().map(Stop::Many),
            presence_penalty: f(self.presence_penalty),
            frequency_penalty: f(self.frequency_penalty),
            logit_bias: self.logit_bias.clone(),
            adapters: self.adapters.clone(),
            ..Default::default()
        }
    }

    /// The variant's `response_format` and tools as the one [`Structure`] (laid over a
    /// request's by [`Structure::overlaid`]).
    pub fn structure(&self) -> Structure {
        Structure {
            response_format: self.response_format.clone(),
            tools: self.tools.clone(),
            tool_choice: self.tool_choice.clone(),
            parallel_tool_calls: self.parallel_tool_calls,
        }
    }

    /// A request as this variant sends it — the one way a variant is applied, for chat,
    /// completions and fan-out alike: its prompt ([`Variant::chat`] for a conversation,
    /// [`Variant::completion_prompt`] for a completions prompt), its sampling settings over the
    /// request's, its `response_format` and tools over the request's.
    pub fn apply(&self, request: Asked) -> Result<Asked, VariantError> {
        let prompt = match &request.prompt {
            Prompt::Chat(m) => Prompt::Chat(self.chat(m)?),
            Prompt::Text(t) => Prompt::Text(self.completion_prompt(t)?),
        };
        Ok(Asked {
            prompt,
            sampling: request.sampling.overlaid(&self.sampling()),
            structure: request.structure.overlaid(&self.structure()),
        })
    }

    /// A conversation as this variant sends it: its system prompt (when it has one) replaces
    /// the caller's system messages and goes first; the last user message is rendered through
    /// the template (`{{ input }}` is that message); everything else is kept in order.
    pub fn chat(&self, messages: &[Message]) -> Result<Vec<Message>, VariantError> {
        let mut out = Vec::with_capacity(messages.len() + 1);
        if let Some(sys) = &self.system {
            out.push(Message::new("system", sys));
        }
        let last_user = messages.iter().rposition(|m| m.role == "user");
        for (i, m) in messages.iter().enumerate() {
            if self.system.is_some() && m.role == "system" {
                continue;
            }
            if Some(i) == last_user {
                let text = render(&self.template, &m.content).map_err(|e| self.err(e))?;
                out.push(Message::new("user", &text));
            } else {
                out.push(m.clone());
            }
        }
        Ok(out)
    }

    /// One input (a fan-out): the conversation of a single user message.
    pub fn chat_for_input(&self, input: &str) -> Result<Vec<Message>, VariantError> {
        self.chat(&[Message::new("user", input)])
    }

    /// A dataset row (eval): the template sees every field of the row.
    pub fn chat_for_row(&self, row: &Value) -> Result<Vec<Message>, VariantError> {
        let user = render_row(&self.template, row).map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(2);
        if let Some(s) = &self.system {
            out.push(Message::new("system", s));
        }
        out.push(Message::new("user", &user));
        Ok(out)
    }

    /// A completions prompt: the rendered template, after the system prompt and a blank line.
    pub fn completion_prompt(&self, prompt: &str) -> Result<String, VariantError> {
        let rendered = render(&self.template, prompt).map_err(|e| self.err(e))?;
        Ok(match &self.system {
            Some(sys) => format!("{sys}\n\n{rendered}"),
            None => rendered,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variant(system: Option<&str>, template: &str) -> Variant {
        let toml = format!(
            "id = \"v\"\ntemplate = {template:?}\ntemperature = 0.5\nmax_tokens = 9\n{}",
            system
                .map(|s| format!("system = {s:?}\n"))
                .unwrap_or_default()
        );
        toml::from_str(&toml).unwrap()
    }

    #[test]
    fn the_system_prompt_replaces_the_callers_and_the_last_user_message_is_templated() {
        let v = variant(Some("Be brief."), "Q: {{ input }}");
        let msgs = [
            Message::new("system", "caller's system"),
            Message::new("user", "first"),
            Message::new("assistant", "answer"),
            Message::new("user", "second"),
        ];
        let out = v.chat(&msgs).unwrap();
        let pairs: Vec<(&str, &str)> = out
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("system", "Be brief."),
                ("user", "first"),
                ("assistant", "answer"),
                ("user", "Q: second")
            ]
        );
        let plain = variant(None, "{{ input }}!");
        assert_eq!(
            plain.chat(&msgs).unwrap()[0],
            Message::new("system", "caller's system"),
            "no variant system: the caller's stays"
        );
    }

    #[test]
    fn inputs_rows_and_completion_prompts_and_sampling() {
        let v = variant(Some("S"), "{{ input }} ({{ topic | default('any') }})");
        assert_eq!(
            v.chat_for_input("hi").unwrap(),
            [
                Message::new("system", "S"),
                Message::new("user", "hi (any)")
            ]
        );
        let row = serde_json::json!({"input": "hi", "topic": "books"});
        assert_eq!(v.chat_for_row(&row).unwrap()[1].content, "hi (books)");
        assert_eq!(v.completion_prompt("hi").unwrap(), "S\n\nhi (any)");
        assert_eq!(
            v.sampling(),
            Sampling {
                temperature: Some(0.5),
                max_tokens: Some(9),
                ..Default::default()
            }
        );
        // over a request: the variant's settings win where it has them
        let req = Sampling {
            temperature: Some(1.5),
            top_p: Some(0.5),
            ..Default::default()
        };
        let asked = Asked {
            prompt: Prompt::Chat(vec![Message::new("user", "hi")]),
            sampling: req.clone(),
            structure: Structure::default(),
        };
        let s = v.apply(asked).unwrap().sampling;
        assert_eq!(
            (s.temperature, s.top_p, s.max_tokens),
            (Some(0.5), Some(0.5), Some(9))
        );
        let bad = variant(None, "{{ missing }}");
        let e = bad.chat_for_input("x").unwrap_err();
        assert_eq!(e.variant, "v");
        assert!(
            e.to_string()
                .starts_with("variant 'v': template does not render"),
            "{e}"
        );
    }
}
