//! Renders chat messages into a prompt with the model's own `tokenizer.chat_template` (Jinja,
//! as Hugging Face writes it) through minijinja.
//!
//! Using the template shipped in the GGUF, instead of a hand-written format per model family,
//! is what makes a chat request produce exactly the prompt the model was trained on.

pub use abserve_protocol::ChatMessage;
use abserve_protocol::Tool;
use minijinja::{context, Environment, Error, ErrorKind};

use crate::tools::ToolFormat;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("this model has no chat template (tokenizer.chat_template is missing from the GGUF); use the completions endpoint with a plain prompt")]
    Missing,
    #[error("the model's chat template does not compile: {0}")]
    Compile(String),
    #[error("the model's chat template failed to render these messages: {0}")]
    Render(String),
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// How this template writes tool calls.
    tool_format: ToolFormat,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    pub fn new(source: Option<&str>, bos: &str, eos: &str) -> Result<Self, ChatTemplateError> {
        let source = source.ok_or(ChatTemplateError::Missing)?;
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> String {
            // the templates that use it only want today's date; a fixed render keeps prompts
            // reproducible for A/B comparisons
            let _ = fmt;
            String::new()
        });
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| ChatTemplateError::Compile(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos: bos.into(),
            eos: eos.into(),
            tool_format: ToolFormat::detect(Some(source)),
        })
    }

    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// The prompt of `messages`; `tools` (non-empty) are handed to the template as Hugging Face
    /// templates take them, and calls in the history as `tool_calls` with their arguments
    /// parsed (`{"type": "function", "function": {"name", "arguments": {...}}}`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ChatTemplateError::Compile(e.to_string()))?;
        let messages: Vec<serde_json::Value> = messages.iter().map(template_message).collect();
        let tools = (!tools.is_empty()).then_some(tools);
        tmpl.render(context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| ChatTemplateError::Render(e.to_string()))
    }
}

/// A message as Hugging Face chat templates read it.
fn template_message(m: &ChatMessage) -> serde_json::Value {
    let mut v = serde_json::json!({"role": m.role, "content": m.content});
    if !m.tool_calls.is_empty() {
        let calls: Vec<serde_json::Value> = m
            .tool_calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str(&c.function.arguments)
                    .unwrap_or_else(|_| serde_json::Value::String(c.function.arguments.clone()));
                serde_json::json!({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            })
            .collect();
        v["tool_calls"] = serde_json::Value::Array(calls);
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = serde_json::json!(id);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(Some(CHATML), "", "").unwrap();
        let s = t
            .render(&[ChatMessage::new("user", "Hi")], &[], true)
            .unwrap();
        assert_eq!(s, "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn missing_template_is_a_clear_error() {
        let e = ChatTemplate::new(None, "", "").unwrap_err();
        assert!(e.to_string().contains("no chat template"));
    }

    #[test]
    fn raise_exception_becomes_render_error() {
        let t = ChatTemplate::new(
            Some("{{ raise_exception('roles must alternate') }}"),
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[], &[], true).unwrap_err();
        assert!(e.to_string().contains("roles must alternate"));
    }

    #[test]
    fn python_string_methods_work() {
        let t = ChatTemplate::new(Some("{{ messages[0].content.strip() }}"), "", "").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  x  ")], &[], false)
                .unwrap(),
            "x"
        );
    }
}
