//! `abserve eval --amqp`: the run's rows × variants become jobs on RabbitMQ, answered by
//! `abserve worker`s; results come back on the run's own queue and are scored and written here
//! as they arrive, exactly as an in-process run writes them. The broker side (topology,
//! publishing with confirms, consuming results) is `abserve_queue::run`.
//!
//! Every job is confirmed before any result is awaited. A result is acked only after it is in
//! `results.jsonl`; the first result per job id counts and later ones (a redelivered job
//! answered twice) are dropped, so each row × variant is written once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use abserve_ab::Variant;
use abserve_protocol::jobs::Job;
use abserve_queue::run::Run;
use rand::Rng;

use crate::config::EvalConfig;
use crate::dataset::Row;
use crate::error::EvalError;
use crate::results::ResultRow;
use crate::row_call::{blank, call_for, record};
use crate::target::Capacity;

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
    let id = format!("{:012x}", rand::thread_rng().gen::<u64>() >> 16);
    let mut run = Run::open(&q.amqp, &q.queue, id.clone()).await?;
    let mut pending: BTreeMap<String, (&Row, &Variant)> = BTreeMap::new();
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
            id: format!("{id}/{}/{}", row.id, v.id),
            run: id.clone(),
            row: row.id.clone(),
            variant: v.id.clone(),
            call,
        };
        run.publish(&job).await?;
        pending.insert(job.id, (row, v));
    }
    run.confirm_all().await?;
    let workers = run.workers();
    eprintln!(
        "eval: {} jobs confirmed on '{}' (run {id}, {workers} workers consuming); results on '{}'",
        pending.len(),
        run.jobs_queue(),
        run.results_queue()
    );
    collect(cfg, &run, q.prefetch, &mut pending, &mut keep).await?;
    let source = format!(
        "RabbitMQ queue '{}' ({workers} workers at the start)",
        run.jobs_queue()
    );
    run.finish().await?;
    Ok(Capacity {
        concurrency: q.prefetch as usize,
        source,
        abserve: false,
    })
}

/// Consumes the run's results until every pending job has one; says what it waits for when
/// nothing arrives for a while (no worker, a backlog).
async fn collect(
    cfg: &EvalConfig,
    run: &Run,
    prefetch: u16,
    pending: &mut BTreeMap<String, (&Row, &Variant)>,
    keep: &mut impl FnMut(ResultRow) -> Result<(), EvalError>,
) -> Result<(), EvalError> {
    let mut results = run.results(prefetch).await?;
    let mut last = Instant::now();
    while !pending.is_empty() {
        let Some(received) = results.next(Duration::from_secs(10)).await? else {
            eprintln!("eval: {}", run.backlog(pending.len(), last.elapsed()).await);
            continue;
        };
        last = Instant::now();
        let r = &received.result;
        // the first result of a job counts; a redelivered job's second answer is dropped
        if let Some((row, v)) = pending.remove(&r.id) {
            let mut row_result = blank(row, v);
            let answer = match (r.generation.clone(), r.error.clone()) {
                (Some(g), None) => Ok(g),
                (_, e) => {
                    Err(e
                        .unwrap_or_else(|| "the worker sent neither an answer nor an error".into()))
                }
            };
            record(cfg, row, &mut row_result, answer, r.attempts).await;
            keep(row_result)?;
        }
        received.ack().await?;
    }
    Ok(())
}
