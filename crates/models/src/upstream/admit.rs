//! A group of sequences from submission to admission: each prompt counted and given its
//! `max_tokens`, room for all of them taken at once in the pool (in arrival order), then each
//! sent (`call::run`). Its requests count as waiting until then; a group whose every receiver
//! was dropped (the client left, or the server's queue timeout passed) stops waiting.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use abserve_engine::{Class, Event, GenerationError};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedSender;

use super::{call, discover, pool, Shared};

/// Requests of a group still waiting for admission (given back when admitted or cancelled).
pub(crate) struct Waiting(pub Arc<Shared>, pub usize);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(self.1, Ordering::SeqCst);
    }
}

/// A sequence's conversation, prompt bound, body, (`max_tokens`, whether the request set it —
/// 0 set means "leave it to the upstream") and affinity.
pub(crate) type JobParts = (Value, usize, Map<String, Value>, (usize, bool), Option<u64>);

/// Each sequence's cost (prompt + `max_tokens`, counted at the upstream where it can) and the
/// `max_tokens` it is sent with (`None`: left to the upstream); a 400 for one that cannot fit.
async fn costs(
    sh: &Shared,
    jobs: &[JobParts],
) -> Result<(Vec<usize>, Vec<Option<usize>>), GenerationError> {
    let mut costs = vec![];
    let mut max_tokens = vec![];
    let context = sh.pool.context();
    let too_long = |what: String| GenerationError::Upstream {
        status: 400,
        message: format!(
            "{what}, but a request to '{}' holds at most {context} tokens.",
            sh.id
        ),
    };
    for (messages, bound, _, max, _) in jobs {
        let url = &sh.pool.replicas[0].url;
        let prompt = discover::count(&sh.http, url, sh.counting, &sh.model, messages)
            .await
            .unwrap_or(*bound);
        let room = context.saturating_sub(prompt);
        let max = match *max {
            // a hosted API that said nothing of its context: its own default, reserved as 1
            (0, true) => {
                costs.push(prompt + 1);
                max_tokens.push(None);
                continue;
            }
            (m, true) if prompt + m > context => {
                return Err(too_long(format!(
                    "The prompt has {prompt} tokens and max_tokens is {m}"
                )))
            }
            (m, true) => m,
            (_, false) if room == 0 => {
                return Err(too_long(format!("The prompt has {prompt} tokens")))
            }
            (default, false) => room.min(default),
        };
        costs.push(prompt + max);
        max_tokens.push(Some(max));
    }
    Ok((costs, max_tokens))
}

/// Counts a group's prompts, waits for room for all of it, then runs each sequence.
pub(crate) async fn run_group(
    sh: Arc<Shared>,
    jobs: Vec<JobParts>,
    txs: Vec<UnboundedSender<Event>>,
    waiting: Waiting,
    class: Class,
) {
    let queued = Instant::now();
    let all_gone = async {
        for tx in &txs {
            tx.closed().await;
        }
    };
    let admit = async {
        let (costs, max_tokens) = costs(&sh, &jobs).await?;
        let affinity = jobs.first().and_then(|j| j.4);
        match sh.pool.take(&costs, affinity, class).await {
            Ok(r) => Ok((r, max_tokens)),
            Err(pool::Refusal::AllOpen) => Err(GenerationError::Upstream {
                status: 503,
                message: format!("'{}' is unavailable: every URL's circuit breaker is open after repeated failures.", sh.id),
            }),
        }
    };
    let (reservations, max_tokens) = tokio::select! {
        r = admit => match r {
            Ok(r) => r,
            Err(e) => {
                // a request the upstream cannot take now (every breaker open) was served an
                // error, so that its variant's exposure records it (guardrails see it); one that
                // can never fit is refused before it is admitted, as a local model refuses it
                let served = matches!(e, GenerationError::Upstream { status, .. } if status != 400);
                for tx in &txs {
                    if served {
                        let order = sh.order.fetch_add(1, Ordering::SeqCst);
                        let _ = tx.send(Event::Admitted { queue_time: queued.elapsed(), order });
                        sh.series.errors.with_label_values(&["unavailable"]).inc();
                    }
                    let _ = tx.send(Event::Error(e.clone()));
                }
                return;
            }
        },
        _ = all_gone => return,
    };
    let queue_time = queued.elapsed();
    for (((tx, job), reservation), max) in
        txs.into_iter().zip(jobs).zip(reservations).zip(max_tokens)
    {
        let order = sh.order.fetch_add(1, Ordering::SeqCst);
        if tx.send(Event::Admitted { queue_time, order }).is_err() {
            continue;
        }
        let (messages, _, mut body, _, _) = job;
        body.insert("messages".into(), messages);
        if let Some(max) = max {
            body.insert("max_tokens".into(), json!(max));
        }
        // counted as running before the group stops counting as waiting, so that for a moment
        // it counts twice (a queue bound refuses one more) rather than not at all
        sh.running.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(call::run(sh.clone(), reservation, body, tx, queue_time));
    }
    drop(waiting);
}
