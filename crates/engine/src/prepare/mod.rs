//! The one preparation stage: every caller — the server's chat and completions routes and its
//! fan-out, eval in process and (for what it computes itself) over HTTP, the RabbitMQ worker and
//! `abserve generate` — turns its input into engine [`Request`]s here, so a prompt becomes the
//! same tokens and the same sampling parameters whichever path it takes.
//!
//! messages or a prompt (after the variant: `abserve_ab::Variant::apply`) → rendered text (the
//! model's chat template) → tokens → context fit → [`SamplingParams`] from the one [`Sampling`]
//! → the answer's grammar from its [`Structure`], compiled (`structure.rs`).
//!
//! Invariants:
//! - **BOS, once**: a prompt made from text starts with the vocabulary's BOS token exactly when
//!   the vocabulary asks for one (`tokenizer.ggml.add_bos_token`), and never twice. Text (a
//!   rendered template or a plain prompt) is tokenized with special tokens parsed and nothing
//!   added; BOS is then put first unless the text already began with it (templates that write
//!   `bos_token`, or whose first special token is the BOS, as ChatML's `<|im_start|>` is for
//!   SmolLM2). Token-id prompts are taken as sent.
//! - **Context**: a prompt is not empty, has at most `max_prompt_tokens` tokens and leaves room
//!   in the per-sequence context; an unset `max_tokens` is clamped to that room, an explicit one
//!   that does not fit is refused with the numbers.
//! - **Errors**: a [`PrepareError`] names the field, the limit and the value; nothing here knows
//!   HTTP.

mod sampling;
mod structure;

use abserve_protocol::{ChatMessage, Sampling, Structure, Tool};

use crate::adapters::{adapter_set, AdapterBudget, AdapterLease, AdapterSet};
use crate::chat::ChatTemplateError;
use crate::grammar::{Constraint, Grammars};
use crate::request::{Placement, Request, SubmitError};
use crate::sampler::SamplingParams;
use crate::tools::{ToolFormat, ToolUse};

pub use crate::invalid::PrepareError;
pub use sampling::{sampling_params, Options, MAX_STOP, MAX_TOP_K};
pub use structure::{constraint, logit_bias, response_grammar, shape, Shaped, MAX_LOGIT_BIAS};

/// What preparation needs of a model: its chat template and its vocabulary. The engine
/// implements it over the loaded model; the server's tests over a fake.
pub trait Tokenizer {
    /// The model's chat template applied to `messages` (and `tools`, for a template that
    /// renders them: see [`Tokenizer::tool_format`]), ending with the assistant's turn.
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
    ) -> Result<String, ChatTemplateError>;
    /// Token ids of `text`, special tokens parsed, nothing added.
    fn tokenize(&self, text: &str) -> Vec<i32>;
    /// The BOS token, when the vocabulary asks for one at the start of every prompt.
    fn bos(&self) -> Option<i32>;
    fn n_vocab(&self) -> usize;
    /// The grammar compiler of this vocabulary (structured outputs), or why there is none.
    fn grammars(&self) -> Result<&Grammars, String> {
        Err("this model cannot constrain its answers".into())
    }
    /// How the model writes tool calls (its chat template's format; generic by default).
    fn tool_format(&self) -> ToolFormat {
        ToolFormat::Generic
    }
    /// The memory plan's LoRA adapter reservation (`None`: no adapter may be named).
    fn adapters(&self) -> Option<&AdapterBudget> {
        None
    }
}

/// A shared model prepares like the model itself.
impl<T: Tokenizer + ?Sized> Tokenizer for std::sync::Arc<T> {
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
    ) -> Result<String, ChatTemplateError> {
        (**self).render_chat(messages, tools)
    }
    fn tokenize(&self, text: &str) -> Vec<i32> {
        (**self).tokenize(text)
    }
    fn bos(&self) -> Option<i32> {
        (**self).bos()
    }
    fn n_vocab(&self) -> usize {
        (**self).n_vocab()
    }
    fn grammars(&self) -> Result<&Grammars, String> {
        (**self).grammars()
    }
    fn tool_format(&self) -> ToolFormat {
        (**self).tool_format()
    }
    fn adapters(&self) -> Option<&AdapterBudget> {
        (**self).adapters()
    }
}

/// What a request is made from.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// A conversation, rendered with the model's chat template.
    Chat(&'a [ChatMessage]),
    /// A completions prompt as text.
    Text(&'a str),
    /// A completions prompt as token ids (checked against the vocabulary by the caller).
    Tokens(&'a [i32]),
}

/// The context a prompt must fit.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Per-sequence context in tokens (the plan's).
    pub context: usize,
    /// Longest prompt accepted (`serve --max-prompt-tokens`; below the context).
    pub max_prompt_tokens: usize,
}

impl Limits {
    /// Only the context bounds the prompt.
    pub fn context(context: usize) -> Limits {
        Limits {
            context,
            max_prompt_tokens: usize::MAX,
        }
    }
}

/// A prepared prompt: its tokens, the parameters to sample it with and the grammar its answer
/// must match.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub prompt: Vec<i32>,
    pub params: SamplingParams,
    pub constraint: Option<Constraint>,
    /// How the answer's text becomes tool calls (a chat with tools).
    pub tools: Option<ToolUse>,
    /// The LoRA adapters it runs under (empty: the base model).
    pub adapters: AdapterSet,
    /// Keeps them loaded until the request's sequence ends.
    pub lease: AdapterLease,
}

impl Prepared {
    /// An engine request for this prompt (no fairness group).
    pub fn request(mut self) -> Request {
        self.take_request(Placement::default())
    }

    /// The engine request for this prompt placed by `at` (its experiment's fairness group and
    /// KV share, its class): the one place a [`Request`] is made from a prepared prompt. The
    /// grammar and the adapters' lease move to the request (the answer needs only the tokens
    /// and the tools); the rest is copied.
    pub fn take_request(&mut self, at: Placement) -> Request {
        Request {
            group: at.group,
            kv_share: at.kv_share,
            class: at.class,
            priority: at.priority,
            constraint: self.constraint.take(),
            adapters: self.adapters.clone(),
            lease: std::mem::take(&mut self.lease),
            ..Request::new(self.prompt.clone(), self.params.clone())
        }
    }
}

/// The tokens of a prompt made from text: special tokens parsed, BOS first exactly once when
/// the vocabulary asks for it (see the module's invariants).
pub fn text_tokens(tok: &dyn Tokenizer, text: &str) -> Vec<i32> {
    let mut tokens = tok.tokenize(text);
    if let Some(bos) = tok.bos() {
        if tokens.first() != Some(&bos) {
            tokens.insert(0, bos);
        }
    }
    tokens
}

/// The tokens of an input (a chat rendered without tools).
pub fn input_tokens(tok: &dyn Tokenizer, input: Input<'_>) -> Result<Vec<i32>, PrepareError> {
    Ok(match input {
        Input::Chat(messages) => chat_tokens(tok, messages, &[])?,
        Input::Text(text) => text_tokens(tok, text),
        Input::Tokens(ids) => ids.to_vec(),
    })
}

/// The tokens of a chat rendered with the model's template (and `tools`, where it renders them).
pub fn chat_tokens(
    tok: &dyn Tokenizer,
    messages: &[ChatMessage],
    tools: &[Tool],
) -> Result<Vec<i32>, PrepareError> {
    let text = tok
        .render_chat(messages, tools)
        .map_err(|e| PrepareError::new("messages", e.to_string()))?;
    Ok(text_tokens(tok, &text))
}

/// An input and its sampling settings as a prompt the engine can run (see the module doc).
pub fn prepare(
    tok: &dyn Tokenizer,
    input: Input<'_>,
    sampling: &Sampling,
    structure: &Structure,
    options: &Options,
    limits: Limits,
) -> Result<Prepared, PrepareError> {
    let mut params = sampling_params(sampling, options)?;
    params.logit_bias = logit_bias(sampling.logit_bias.as_ref(), tok.n_vocab())?;
    let messages = match input {
        Input::Chat(m) => Some(m),
        Input::Text(_) | Input::Tokens(_) => None,
    };
    let shaped = shape(tok, messages, structure)?;
    let prompt = match input {
        Input::Chat(_) => chat_tokens(tok, &shaped.messages, &shaped.template_tools)?,
        other => input_tokens(tok, other)?,
    };
    let field = match input {
        Input::Chat(_) => "messages",
        Input::Text(_) | Input::Tokens(_) => "prompt",
    };
    fit_context(
        &prompt,
        &mut params,
        sampling.max_tokens.is_some(),
        limits,
        field,
    )?;
    let constraint = constraint(tok, shaped.grammar.as_ref())?;
    let (adapters, lease) = adapter_set(tok.adapters(), sampling.adapters.as_deref())?;
    Ok(Prepared {
        prompt,
        params,
        constraint,
        tools: shaped.tools,
        adapters,
        lease,
    })
}

/// Checks a prompt against the context: not empty, at most `max_prompt_tokens`, and room left
/// for `max_tokens` — clamped to the room when the caller did not set it (`explicit_max`), an
/// error naming the numbers when it did. A prompt that is too long is an error of `field`
/// (`messages` or `prompt`).
pub fn fit_context(
    prompt: &[i32],
    params: &mut SamplingParams,
    explicit_max: bool,
    limits: Limits,
    field: &str,
) -> Result<(), PrepareError> {
    let ctx = limits.context;
    let limit = limits.max_prompt_tokens.min(ctx.saturating_sub(1));
    let too_long = || {
        PrepareError::new(
            field,
            format!(
                "This model's maximum context length is {ctx} tokens and prompts may have at most {limit} tokens; your prompt has {} tokens.",
                prompt.len()
            ),
        )
        .beyond(limit, prompt.len())
    };
    // the engine's rule (empty, or no room for a token after it), then the server's own limit
    match crate::request::prompt_fits(prompt.len(), ctx) {
        Err(SubmitError::EmptyPrompt) => {
            return Err(PrepareError::new("prompt", "The prompt is empty."))
        }
        Err(_) => return Err(too_long()),
        Ok(()) => {}
    }
    if prompt.len() > limits.max_prompt_tokens {
        return Err(too_long());
    }
    let room = ctx - prompt.len();
    if !explicit_max {
        params.max_tokens = params.max_tokens.min(room as u32);
    } else if params.max_tokens as usize > room {
        return Err(PrepareError::new(
            "max_tokens",
            format!(
                "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({} in the prompt, {} for the completion). Reduce the prompt or max_tokens.",
                prompt.len() + params.max_tokens as usize,
                prompt.len(),
                params.max_tokens
            ),
        )
        .beyond(room, params.max_tokens));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
