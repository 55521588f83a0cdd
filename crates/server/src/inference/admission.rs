//! Admission, the path every generation goes through: a request's sequences enter their
//! model's queue as one group (all or none; a 429 with Retry-After when there is no room now,
//! a 400 when there never can be), then wait for admission within the queue timeout.

use abserve_engine::{Event, Placement, SubmitError};
use abserve_models::Prepared;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::state::AppState;

/// What the sequences of a group are, for the 400 that says it can never be accepted whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOf {
    /// A fan-out: one per variant.
    Variants,
    /// `n` choices of one prompt.
    Choices,
    /// Several prompts of a completions request (× `n`).
    Completions,
}

/// One sequence of a group: its events and, once it was admitted, its engine-wide admission
/// order (the `Admitted` event was read); `None` for a member of a group larger than the slots
/// that is admitted later (its `Admitted` event is still in `rx`).
pub struct Admitted {
    pub rx: UnboundedReceiver<Event>,
    pub order: Option<u64>,
}

/// Submits requests that need several sequences (a fan-out, `n` choices, a multi-prompt
/// completion) as one group: all enter the engine, or none (a 429 when the slots and the
/// queue have no room for all now, a 400 when they never can). A group that fits the slots
/// is admitted together, in one step; this waits for that within the queue timeout (a 429
/// after it, every receiver dropped, none of the group having run). A larger group can
/// never run at once: it holds its places in the queue, and this waits for its first
/// member; the rest run as slots free. Model `i` of the registry runs the group, placed by `at`
/// (the experiment's fairness group and share of the memory, the priority class).
pub async fn admit_group(
    state: &AppState,
    i: usize,
    seqs: Vec<Prepared>,
    at: Placement,
    what: GroupOf,
) -> Result<Vec<Admitted>, ApiError> {
    refuse_when_shutting_down(state)?;
    let model = state.models.at(i);
    let mut rxs = model
        .submit(seqs, at)
        .map_err(|e| refused(state, e, what))?;
    let deadline = tokio::time::sleep(state.config.queue_timeout);
    tokio::pin!(deadline);
    let together = abserve_engine::admitted_together(rxs.len(), model.capacity().seq_slots);
    let wait_for = if together { rxs.len() } else { 1 };
    let mut admitted = Vec::with_capacity(rxs.len());
    for mut rx in rxs.drain(..) {
        if admitted.len() >= wait_for {
            // admitted later, as slots free; its `Admitted` event stays in its stream
            admitted.push(Admitted { rx, order: None });
            continue;
        }
        let order = tokio::select! {
            ev = rx.recv() => match ev {
                Some(Event::Admitted { order, .. }) => order,
                Some(Event::Error(e)) => return Err(ApiError::generation(e)),
                Some(_) | None => return Err(ApiError::unavailable("The engine stopped.")),
            },
            _ = &mut deadline => {
                state.metrics.reject("queue_timeout");
                return Err(ApiError::overloaded(
                    format!("The request waited longer than the queue timeout of {:?}.", state.config.queue_timeout),
                    state.retry_after(),
                ));
            }
        };
        admitted.push(Admitted {
            rx,
            order: Some(order),
        });
    }
    Ok(admitted)
}

fn refuse_when_shutting_down(state: &AppState) -> Result<(), ApiError> {
    if state.is_shutting_down() {
        state.metrics.reject("shutting_down");
        return Err(ApiError::unavailable("The server is shutting down."));
    }
    Ok(())
}

/// The answer to a request the engine did not take.
fn refused(state: &AppState, e: SubmitError, what: GroupOf) -> ApiError {
    match e {
        SubmitError::QueueFull(n) => {
            state.metrics.reject("queue_full");
            ApiError::overloaded(
                format!("The server is at capacity ({n} requests waiting). Retry after the delay in Retry-After."),
                state.retry_after(),
            )
        }
        SubmitError::GroupTooLarge {
            group,
            capacity,
            slots,
            queue,
        } => {
            let (param, has, advice) = match what {
                GroupOf::Variants => (
                    "variants",
                    "This fan-out has {group} variants",
                    "or split the experiment",
                ),
                GroupOf::Choices => (
                    "n",
                    "This request asks for {group} choices (n)",
                    "or ask for fewer choices",
                ),
                GroupOf::Completions => (
                    "prompt",
                    "This request asks for {group} completions (prompts × n)",
                    "or send fewer prompts",
                ),
            };
            let has = has.replace("{group}", &group.to_string());
            ApiError::invalid_param(
                param,
                format!(
                    "{has} but the server holds at most {capacity} sequences at once ({slots} sequence slots + {queue} queued), so it could never be accepted whole; raise --max-sequences or --max-queue, {advice}."
                ),
            )
        }
        SubmitError::ShuttingDown => {
            state.metrics.reject("shutting_down");
            ApiError::unavailable("The server is shutting down.")
        }
        SubmitError::PromptTooLong { prompt, context } => {
            state.metrics.reject("too_long");
            ApiError::invalid_param(
                "messages",
                format!("The prompt has {prompt} tokens but the context is {context} tokens."),
            )
        }
        SubmitError::EmptyPrompt => ApiError::invalid_param("prompt", "The prompt is empty."),
        SubmitError::Invalid(p, m) => ApiError::invalid_param(p, m),
    }
}
