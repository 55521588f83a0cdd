//! Why a request could not be prepared: the field at fault, the limit it passed and the value it
//! held, with a message in OpenAI's words. The server maps it to a 400 in OpenAI's error body;
//! eval and the worker record it as a failed call; `generate` prints it.

/// A request the engine must not run, named by the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct PrepareError {
    /// The request field, as OpenAI names it (`max_tokens`, `messages[2].role`,
    /// `variants.b.temperature` for an experiment's variant).
    pub field: String,
    /// What the field may hold, where a limit was passed (`between 0 and 2`, `16`).
    pub limit: Option<String>,
    /// What it held, where that can be said.
    pub value: Option<String>,
    pub message: String,
    /// The request is valid but cannot run now (what it needs is held by running requests):
    /// the server answers 429 with `Retry-After` instead of 400.
    pub retry: bool,
}

impl PrepareError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        PrepareError {
            field: field.into(),
            limit: None,
            value: None,
            message: message.into(),
            retry: false,
        }
    }

    /// The same error with the limit passed and the value that passed it.
    pub fn beyond(mut self, limit: impl ToString, value: impl ToString) -> Self {
        self.limit = Some(limit.to_string());
        self.value = Some(value.to_string());
        self
    }

    /// The same error, marked as passing once running requests finish.
    pub fn retry_later(mut self) -> Self {
        self.retry = true;
        self
    }

    /// The same error, its field inside `scope` (`variants.b` + `temperature`).
    pub fn within(mut self, scope: &str) -> Self {
        self.field = format!("{scope}.{}", self.field);
        self
    }
}
