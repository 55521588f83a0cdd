//! `abserve eval --amqp`: the run's rows × variants become jobs on RabbitMQ (`queue`), answered
//! by `abserve worker`s; results come back on the run's own queue and are scored and written
//! here as they arrive, exactly as an in-process run writes them.
//!
//! Every job is published persistent with a publisher confirm before any result is awaited. A
//! result is acked only after it is in `results.jsonl`; the first result per job id counts and
//! later ones (a redelivered job answered twice) are dropped, so each row × variant is written
//! once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use abserve_ab::Variant;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Channel;
use rand::Rng;

use crate::config::EvalConfig;
use crate::dataset::Row;
use crate::error::EvalError;
use crate::results::ResultRow;
use crate::row_call::{blank, call_for, record};
use crate::target::Capacity;
use abserve_protocol::jobs::{Job, JobResult};
use abserve_queue::topology::{self as queue, amqp, Queues};

/// A run's results queue is deleted by the broker after this long without a consumer.
const RESULTS_EXPIRE_MS: i32 = 24 * 3600 * 1000;

/// Where the jobs go.
#[derive(Debug, Clone)]
pub struct QueueSpec {
    pub amqp: String,
    /// The jobs queue (default `abserve.jobs`).
    pub queue: String,
    /// Results in flight between the broker and this process.
    pub prefetch: u16,
}

/// Publishes `jobs`, then hands each result to `keep` as it arrives, until every job has one.
pub(crate) async fn generate(
    cfg: &EvalConfig,
    jobs: Vec<(&Row, &Variant)>,
    q: &QueueSpec,
    mut keep: impl FnMut(ResultRow) -> Result<(), EvalError>,
) -> Result<Capacity, EvalError> {
    let run = format!("{:012x}", rand::thread_rng().gen::<u64>() >> 16);
    let (conn, ch) = queue::connect(&q.amqp).await?;
    let queues = Queues::new(&q.queue);
    let declared = queues.declare(&ch).await?;
    let results = queues.results(&run);
    declare_results(&ch, &queues, &results, &run).await?;

    let mut pending: BTreeMap<String, (&Row, &Variant)> = BTreeMap::new();
    let mut confirms = Vec::new();
    for (row, v) in jobs {
        let call = match call_for(v, row) {
            Ok(c) => c,
            Err(e) => {
                let mut r = blank(row, v);
                r.error = Some(e.to_string());
                keep(r)?;
                continue;
            }
        };
        let job = Job {
            id: format!("{run}/{}/{}", row.id, v.id),
            run: run.clone(),
            row: row.id.clone(),
            variant: v.id.clone(),
            call,
        };
        confirms.push(publish(&ch, &queues, &results, &job).await?);
        pending.insert(job.id, (row, v));
    }
    for c in confirms {
        if !c
            .await
            .map_err(amqp("waiting for a publisher confirm"))?
            .is_ack()
        {
            return Err(EvalError::Queue(format!(
                "the broker refused a job for '{}' (nack)",
                queues.jobs
            )));
        }
    }
    let workers = declared.consumer_count();
    eprintln!("eval: {} jobs confirmed on '{}' (run {run}, {workers} workers consuming); results on '{results}'", pending.len(), queues.jobs);
    collect(
        cfg,
        &conn,
        &ch,
        &queues,
        &results,
        q.prefetch,
        &mut pending,
        &mut keep,
    )
    .await?;
    ch.queue_delete(&results, QueueDeleteOptions::default())
        .await
        .map_err(amqp("deleting the results queue"))?;
    let _ = conn.close(200, "eval done").await;
    Ok(Capacity {
        concurrency: q.prefetch as usize,
        source: format!(
            "RabbitMQ queue '{}' ({workers} workers at the start)",
            queues.jobs
        ),
        abserve: false,
    })
}

/// The results queue of run `run` (expiring a day after its last consumer left: a rerun of a
/// killed eval resumes from results.jsonl with a new run), with the run's dead letters routed
/// to it too.
async fn declare_results(
    ch: &lapin::Channel,
    queues: &Queues,
    results: &str,
    run: &str,
) -> Result<(), EvalError> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let mut args = FieldTable::default();
    args.insert(
        "x-expires".into(),
        lapin::types::AMQPValue::LongInt(RESULTS_EXPIRE_MS),
    );
    ch.queue_declare(results, durable, args)
        .await
        .map_err(amqp("declaring the results queue"))?;
    queues.bind_dead_letters(ch, results, run).await?;
    Ok(())
}

/// Publishes one job (persistent, its run in a header, replies to `results`); the confirm is
/// awaited by the caller.
async fn publish(
    ch: &lapin::Channel,
    queues: &Queues,
    results: &str,
    job: &Job,
) -> Result<lapin::publisher_confirm::PublisherConfirm, EvalError> {
    let body =
        serde_json::to_vec(job).map_err(|e| EvalError::Queue(format!("encoding a job: {e}")))?;
    let mut headers = FieldTable::default();
    headers.insert(
        queue::RUN.into(),
        AMQPValue::LongString(job.run.as_str().into()),
    );
    let props = queue::persistent()
        .with_reply_to(results.into())
        .with_message_id(job.id.as_str().into())
        .with_headers(headers);
    Ok(ch
        .basic_publish("", &queues.jobs, Default::default(), &body, props)
        .await
        .map_err(amqp("publishing a job"))?)
}

/// Consumes the run's results until every pending job has one; says what it waits for when
/// nothing arrives for a while (no worker, a backlog).
#[allow(clippy::too_many_arguments)]
async fn collect(
    cfg: &EvalConfig,
    conn: &lapin::Connection,
    ch: &Channel,
    queues: &Queues,
    results: &str,
    prefetch: u16,
    pending: &mut BTreeMap<String, (&Row, &Variant)>,
    keep: &mut impl FnMut(ResultRow) -> Result<(), EvalError>,
) -> Result<(), EvalError> {
    let consume = conn
        .create_channel()
        .await
        .map_err(amqp("opening a channel"))?;
    consume
        .basic_qos(prefetch.max(1), BasicQosOptions::default())
        .await
        .map_err(amqp("setting the prefetch"))?;
    let mut consumer = consume
        .basic_consume(
            results,
            "eval",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(amqp("consuming results"))?;
    let mut last = Instant::now();
    while !pending.is_empty() {
        let d = match tokio::time::timeout(Duration::from_secs(10), consumer.next()).await {
            Ok(Some(d)) => d.map_err(amqp("receiving a result"))?,
            Ok(None) => {
                return Err(EvalError::Queue(format!(
                    "the broker closed the results queue '{results}'"
                )))
            }
            Err(_) => {
                waiting(ch, queues, pending.len(), last.elapsed()).await;
                continue;
            }
        };
        last = Instant::now();
        let r: JobResult = match serde_json::from_slice(&d.data) {
            Ok(r) => r,
            // a job of this run that the broker dead-lettered (through NAME.dlx): its worker
            // died or lost its connection with it on every delivery
            Err(e) => match serde_json::from_slice::<Job>(&d.data) {
                Ok(job) => dead_lettered(job, &d.properties, &queues.dead),
                Err(_) => {
                    tracing::warn!("dropping a message on '{results}' that is not a result: {e}");
                    d.ack(BasicAckOptions::default())
                        .await
                        .map_err(amqp("acknowledging"))?;
                    continue;
                }
            },
        };
        // the first result of a job counts; a redelivered job's second answer is dropped
        if let Some((row, v)) = pending.remove(&r.id) {
            let mut row_result = blank(row, v);
            let answer = match (r.generation, r.error) {
                (Some(g), None) => Ok(g),
                (_, e) => {
                    Err(e
                        .unwrap_or_else(|| "the worker sent neither an answer nor an error".into()))
                }
            };
            record(cfg, row, &mut row_result, answer, r.attempts).await;
            keep(row_result)?;
        }
        d.ack(BasicAckOptions::default())
            .await
            .map_err(amqp("acknowledging"))?;
    }
    Ok(())
}

/// The error result of a job the broker dead-lettered.
fn dead_lettered(job: Job, props: &lapin::BasicProperties, dead: &str) -> JobResult {
    // quorum queues count deliveries in x-delivery-count (absent on RabbitMQ before 3.12 when
    // the limit is what dead-lettered it: the limit is then the count)
    let deliveries = match queue::header_int(props, "x-delivery-count") {
        n if n > 0 => n,
        _ => queue::DELIVERY_LIMIT as i64,
    };
    let last = queue::header_str(props, queue::ERROR)
        .map(|e| format!("; its last error: {e}"))
        .unwrap_or_default();
    JobResult {
        id: job.id,
        worker: String::new(),
        attempts: deliveries.max(1) as u32,
        generation: None,
        error: Some(format!(
            "dead-lettered by the broker after {deliveries} deliveries (the delivery limit is {}): \
             a worker died or lost its connection holding it each time{last}; the job waits in '{dead}'",
            queue::DELIVERY_LIMIT
        )),
    }
}

async fn waiting(ch: &Channel, queues: &Queues, pending: usize, quiet: Duration) {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    match ch.queue_declare(&queues.jobs, passive, FieldTable::default()).await {
        Ok(q) if q.consumer_count() == 0 => eprintln!(
            "eval: waiting for {pending} results; no worker consumes '{}' ({} jobs ready): start `abserve worker --amqp …`",
            queues.jobs,
            q.message_count()
        ),
        Ok(q) => eprintln!(
            "eval: waiting for {pending} results ({:.0} s without one; {} jobs ready, {} workers)",
            quiet.as_secs_f64(),
            q.message_count(),
            q.consumer_count()
        ),
        Err(e) => eprintln!("eval: waiting for {pending} results; cannot read the jobs queue: {e}"),
    }
}
