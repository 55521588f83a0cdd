//! `abserve worker`: runs queued eval jobs on the engine in this process, each prepared and run
//! as eval runs it in process (`abserve_models::call`).
//!
//! Back-pressure: the consumer's prefetch is the plan's sequence slots, so the broker never
//! hands this worker more jobs than it can run at once; a full worker takes nothing more and
//! the backlog stays in the queue, where another worker (or an autoscaler) can see it.
//!
//! Durability: a job is acked only after its result is durable: committed to the ledger when
//! there is one, and confirmed by the broker on the run's results queue. A failed job is
//! republished with its failure count and error (confirmed, then the old delivery is acked);
//! after `max_failures` it goes to the dead-letter queue with its error, and the run gets an
//! error result so that the eval can finish and report it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Channel;

use abserve_models::Registry;
use abserve_protocol::calls::CallError;
use abserve_protocol::jobs::{Job, JobResult};

use crate::ledger::Ledger;
use crate::topology::{self as queue, amqp, header_int, Queues, ERROR, FAILURES};
use crate::QueueError;

pub struct Options {
    pub amqp: String,
    /// The jobs queue (its dead-letter queue is `NAME.dead`).
    pub queue: String,
    /// Failures of one job before it is dead-lettered.
    pub max_failures: u32,
    /// Where results are also committed (once per job id) before the ack.
    pub ledger: Option<Ledger>,
}

/// What a worker did, for its log and its `/metrics` (read at every scrape).
#[derive(Debug, Default)]
pub struct Tally {
    pub answered: AtomicU64,
    pub retried: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Requeued after an error of the worker itself (a lost confirm, a store write that failed).
    pub returned: AtomicU64,
    /// Delivered and not yet acknowledged or returned.
    pub in_hand: AtomicU64,
    /// Microseconds from delivery to acknowledgement (or return), summed over finished jobs.
    pub busy_micros: AtomicU64,
}

/// One delivery counted in `Tally::in_hand` until dropped, also when its task panics.
struct InHand(Arc<Tally>);

impl InHand {
    fn count(tally: &Arc<Tally>) -> Self {
        tally.in_hand.fetch_add(1, Ordering::Relaxed);
        InHand(tally.clone())
    }
}

impl Drop for InHand {
    fn drop(&mut self) {
        self.0.in_hand.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Ctx {
    engines: Arc<Registry>,
    publish: Channel,
    queues: Queues,
    max_failures: u32,
    ledger: Option<Ledger>,
    worker: String,
    tally: Arc<Tally>,
}

/// This worker's name in results: host and process id.
pub fn worker_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{host}-{}", std::process::id())
}

/// Answers one delivery, counted in hand until it is acked or returned: an error of the worker
/// itself (a lost confirm, a store write that failed) returns the job to the queue for another
/// try (the broker counts it toward the delivery limit).
async fn take(ctx: Arc<Ctx>, d: Delivery) -> Result<(), QueueError> {
    let in_hand = InHand::count(&ctx.tally);
    let t0 = std::time::Instant::now();
    let r = handle(&ctx, &d).await;
    if r.is_err() {
        let requeue = BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        let _ = d.nack(requeue).await;
        ctx.tally.returned.fetch_add(1, Ordering::Relaxed);
    }
    let took = t0.elapsed().as_micros().min(u64::MAX as u128) as u64;
    ctx.tally.busy_micros.fetch_add(took, Ordering::Relaxed);
    drop(in_hand);
    r
}

/// Consumes jobs until `stop` resolves or the broker closes the consumer; then finishes the
/// jobs in hand (acking each) and returns.
pub async fn work(
    engines: Arc<Registry>,
    slots: u16,
    opts: Options,
    tally: Arc<Tally>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), QueueError> {
    let (conn, publish) = queue::connect(&opts.amqp).await?;
    let queues = Queues::new(&opts.queue);
    queues.declare(&publish).await?;
    let consume = conn
        .create_channel()
        .await
        .map_err(amqp("opening a channel"))?;
    consume
        .basic_qos(slots.max(1), BasicQosOptions::default())
        .await
        .map_err(amqp("setting the prefetch"))?;
    let worker = worker_name();
    let mut consumer = consume
        .basic_consume(
            &queues.jobs,
            &worker,
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(amqp("consuming"))?;
    tracing::info!(
        "worker {worker}: consuming '{}' with a prefetch of {} (the plans' sequence slots)",
        queues.jobs,
        slots.max(1)
    );
    let ctx = Arc::new(Ctx {
        engines,
        publish,
        queues,
        max_failures: opts.max_failures.max(1),
        ledger: opts.ledger,
        worker: worker.clone(),
        tally,
    });
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            d = consumer.next() => match d {
                Some(Ok(d)) => {
                    tasks.spawn(take(ctx.clone(), d));
                }
                Some(Err(e)) => return Err(QueueError(format!("consuming: {e}"))),
                None => break,
            },
            Some(done) = tasks.join_next() => log_task(done),
            _ = &mut stop => break,
        }
    }
    // no new deliveries; the ones in hand are finished and acked
    let _ = consume
        .basic_cancel(&worker, BasicCancelOptions::default())
        .await;
    while let Some(done) = tasks.join_next().await {
        log_task(done);
    }
    let _ = conn.close(200, "worker stopping").await;
    Ok(())
}

fn log_task(done: Result<Result<(), QueueError>, tokio::task::JoinError>) {
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("job returned to the queue: {e}"),
        Err(e) => tracing::error!("job task failed: {e}"),
    }
}

async fn handle(ctx: &Ctx, d: &Delivery) -> Result<(), QueueError> {
    let failures = header_int(&d.properties, FAILURES).max(0) as u32;
    let job: Job = match serde_json::from_slice(&d.data) {
        Ok(j) => j,
        Err(e) => {
            dead_letter(ctx, d, &format!("not a job: {e}"), failures).await?;
            return ack(d).await;
        }
    };
    let answer = loop {
        match abserve_models::call::chat(&ctx.engines, &job.call).await {
            // the prefetch keeps the engine from filling up; another caller may still have
            Err(CallError::Overloaded { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            r => break r,
        }
    };
    match answer {
        Ok(g) => {
            let r = JobResult {
                id: job.id.clone(),
                worker: ctx.worker.clone(),
                attempts: failures + 1,
                generation: Some(g),
                error: None,
            };
            reply(ctx, d, &job, &r).await?;
            ctx.tally.answered.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) if failures + 1 < ctx.max_failures => {
            tracing::warn!(
                "job {} failed ({} of {} tries): {e}; requeued",
                job.id,
                failures + 1,
                ctx.max_failures
            );
            let props = d
                .properties
                .clone()
                .with_headers(headers(d, failures + 1, &e.to_string()));
            queue::publish_confirmed(&ctx.publish, &ctx.queues.jobs, &d.data, props).await?;
            ctx.tally.retried.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            let error = format!("failed {} times; last error: {e}", failures + 1);
            tracing::error!("job {}: {error}; moved to '{}'", job.id, ctx.queues.dead);
            dead_letter(ctx, d, &error, failures + 1).await?;
            let r = JobResult {
                id: job.id.clone(),
                worker: ctx.worker.clone(),
                attempts: failures + 1,
                generation: None,
                error: Some(error),
            };
            reply(ctx, d, &job, &r).await?;
        }
    }
    ack(d).await
}

/// Makes a result durable: the ledger (once per job id), then the run's results queue.
async fn reply(ctx: &Ctx, d: &Delivery, job: &Job, r: &JobResult) -> Result<(), QueueError> {
    let body = serde_json::to_vec(r).map_err(|e| QueueError(format!("encoding a result: {e}")))?;
    if let Some(l) = &ctx.ledger {
        l.put(&job.id, &job.run, &String::from_utf8_lossy(&body))
            .await?;
    }
    match d.properties.reply_to() {
        Some(q) => {
            queue::publish_confirmed(
                &ctx.publish,
                q.as_str(),
                &body,
                queue::persistent().with_message_id(job.id.as_str().into()),
            )
            .await
        }
        None => Ok(()),
    }
}

async fn dead_letter(
    ctx: &Ctx,
    d: &Delivery,
    error: &str,
    failures: u32,
) -> Result<(), QueueError> {
    let props = d
        .properties
        .clone()
        .with_headers(headers(d, failures, error));
    queue::publish_confirmed(&ctx.publish, &ctx.queues.dead, &d.data, props).await?;
    ctx.tally.dead_lettered.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The delivery's headers with the failure count and last error set.
fn headers(d: &Delivery, failures: u32, error: &str) -> FieldTable {
    let mut h = d.properties.headers().clone().unwrap_or_default();
    h.insert(FAILURES.into(), AMQPValue::LongLongInt(failures as i64));
    h.insert(ERROR.into(), AMQPValue::LongString(error.into()));
    h
}

async fn ack(d: &Delivery) -> Result<(), QueueError> {
    d.ack(BasicAckOptions::default())
        .await
        .map_err(amqp("acknowledging"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_task_that_panics_is_no_longer_counted_in_hand() {
        let tally = Arc::new(Tally::default());
        let in_hand = InHand::count(&tally);
        assert_eq!(tally.in_hand.load(Ordering::Relaxed), 1);
        let task = tokio::spawn(async move {
            let _in_hand = in_hand;
            panic!("a job task that panics");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert_eq!(tally.in_hand.load(Ordering::Relaxed), 0);
    }
}
