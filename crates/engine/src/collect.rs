//! Reading one request's events to the end: the single place where a whole answer is put
//! together from `Admitted`, `Token`, `Done` and `Error` events (the server's whole responses,
//! fan-out, the readiness probe, `eval` in-process and `generate` all use it; the server's
//! streaming path forwards events one by one instead).

use std::time::{Duration, Instant};

use crate::request::{Completion, Event, EventReceiver, GenerationError};
use crate::sampler::TokenLogprob;

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Output {
    pub text: String,
    pub tokens: Vec<i32>,
    /// One entry per token when the request asked for log-probabilities.
    pub logprobs: Vec<TokenLogprob>,
    pub completion: Completion,
    /// Engine-wide admission order (`None` if the admission event was consumed by the caller).
    pub admission_order: Option<u64>,
    /// From the start of collection (≈ submission) to the first token, as the caller saw it.
    pub first_token_after: Option<Duration>,
}

/// Folds events into an [`Output`]; `push` returns the result once the request ended.
#[derive(Debug)]
pub struct Collector {
    started: Instant,
    text: String,
    tokens: Vec<i32>,
    logprobs: Vec<TokenLogprob>,
    order: Option<u64>,
    first: Option<Duration>,
}

impl Default for Collector {
    fn default() -> Self {
        Collector::new()
    }
}

impl Collector {
    pub fn new() -> Self {
        Collector {
            started: Instant::now(),
            text: String::new(),
            tokens: vec![],
            logprobs: vec![],
            order: None,
            first: None,
        }
    }

    pub fn push(&mut self, ev: Event) -> Option<Result<Output, GenerationError>> {
        match ev {
            Event::Admitted { order, .. } => self.order = Some(order),
            Event::Token {
                token,
                text,
                logprob,
            } => {
                self.first.get_or_insert_with(|| self.started.elapsed());
                self.tokens.push(token);
                self.text.push_str(&text);
                self.logprobs.extend(logprob);
            }
            Event::Done(completion) => {
                let mut text = std::mem::take(&mut self.text);
                text.push_str(&completion.tail_text);
                return Some(Ok(Output {
                    text,
                    tokens: std::mem::take(&mut self.tokens),
                    logprobs: std::mem::take(&mut self.logprobs),
                    completion,
                    admission_order: self.order,
                    first_token_after: self.first,
                }));
            }
            Event::Error(e) => return Some(Err(e)),
        }
        None
    }
}

/// Waits for the whole answer. Dropping the future drops the receiver, which cancels the
/// sequence in the engine.
pub async fn collect(mut rx: EventReceiver) -> Result<Output, GenerationError> {
    let mut c = Collector::new();
    while let Some(ev) = rx.recv().await {
        if let Some(r) = c.push(ev) {
            return r;
        }
    }
    Err(GenerationError::EngineStopped)
}

/// [`collect`] for a thread outside any async runtime.
pub fn collect_blocking(mut rx: EventReceiver) -> Result<Output, GenerationError> {
    let mut c = Collector::new();
    while let Some(ev) = rx.blocking_recv() {
        if let Some(r) = c.push(ev) {
            return r;
        }
    }
    Err(GenerationError::EngineStopped)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::request::FinishReason;

    fn done(tail: &str) -> Completion {
        Completion {
            finish_reason: FinishReason::Length,
            prompt_tokens: 3,
            completion_tokens: 2,
            shared_prompt_tokens: 0,
            preemptions: 0,
            queue_time: Duration::ZERO,
            time_to_first_token: Duration::ZERO,
            total_time: Duration::ZERO,
            tail_text: tail.into(),
            grammar: None,
            cost: None,
        }
    }

    #[test]
    fn folds_tokens_and_the_held_back_tail_into_one_answer() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(Event::Admitted {
            queue_time: Duration::ZERO,
            order: 7,
        })
        .unwrap();
        tx.send(Event::Token {
            token: 5,
            text: "Hel".into(),
            logprob: None,
        })
        .unwrap();
        tx.send(Event::Token {
            token: 6,
            text: "lo".into(),
            logprob: None,
        })
        .unwrap();
        tx.send(Event::Done(done("!"))).unwrap();
        let o = collect_blocking(rx).unwrap();
        assert_eq!(
            (o.text.as_str(), o.tokens.as_slice(), o.admission_order),
            ("Hello!", &[5, 6][..], Some(7))
        );
        assert!(o.first_token_after.is_some());
    }

    #[test]
    fn an_error_or_a_closed_channel_is_an_error() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(Event::Token {
            token: 5,
            text: "a".into(),
            logprob: None,
        })
        .unwrap();
        tx.send(Event::Error(GenerationError::OutOfMemory)).unwrap();
        assert_eq!(
            collect_blocking(rx).unwrap_err(),
            GenerationError::OutOfMemory
        );
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        drop(tx);
        assert_eq!(
            collect_blocking(rx).unwrap_err(),
            GenerationError::EngineStopped
        );
    }
}
