//! The publishing side of the job queue: one eval run ([`Run`]) publishes its jobs, persistent
//! with publisher confirms, and reads their results from its own queue (`NAME.results.RUN`, the
//! jobs' `reply_to`), jobs the broker dead-lettered included, as results with an error. What a
//! job is and what to do with its result is the caller's (`abserve eval --amqp`).
//!
//! Every job is confirmed before any result is awaited ([`Run::confirm_all`]). A result is acked
//! only when the caller says it is kept ([`Received::ack`]); the caller keeps the first result
//! per job id (a redelivered job may be answered twice).

use std::time::Duration;

use abserve_protocol::jobs::{Job, JobResult};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::publisher_confirm::PublisherConfirm;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};

use crate::topology::{self, amqp, Queues, DELIVERY_LIMIT, ERROR, RUN};
use crate::QueueError;

/// A run's results queue is deleted by the broker after this long without a consumer.
const RESULTS_EXPIRE_MS: i32 = 24 * 3600 * 1000;

/// One eval run on the broker: its jobs published, its results queue declared.
pub struct Run {
    conn: Connection,
    ch: Channel,
    queues: Queues,
    results: String,
    workers: u32,
    confirms: Vec<PublisherConfirm>,
}

/// A result delivered to the run, to ack once it is kept.
pub struct Received {
    pub result: JobResult,
    delivery: lapin::message::Delivery,
}

impl Received {
    /// Tells the broker the result is kept (it is then never delivered again).
    pub async fn ack(self) -> Result<(), QueueError> {
        self.delivery
            .ack(BasicAckOptions::default())
            .await
            .map_err(amqp("acknowledging"))
    }
}

/// The results of a run as they arrive.
pub struct Results {
    consumer: lapin::Consumer,
    _channel: Channel,
    /// The results queue's name and the dead-letter queue's, for messages.
    results: String,
    dead: String,
}

impl Run {
    /// Connects, declares the jobs queue `queue` (with its dead-letter topology) and the run's
    /// results queue (expiring a day after its last consumer left: a rerun of a killed eval
    /// resumes with a new run), with the run's dead letters routed to it too.
    pub async fn open(url: &str, queue: &str, id: String) -> Result<Run, QueueError> {
        let (conn, ch) = topology::connect(url).await?;
        let queues = Queues::new(queue);
        let declared = queues.declare(&ch).await?;
        let results = queues.results(&id);
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let mut args = FieldTable::default();
        args.insert("x-expires".into(), AMQPValue::LongInt(RESULTS_EXPIRE_MS));
        ch.queue_declare(&results, durable, args)
            .await
            .map_err(amqp("declaring the results queue"))?;
        queues.bind_dead_letters(&ch, &results, &id).await?;
        Ok(Run {
            conn,
            ch,
            workers: declared.consumer_count(),
            queues,
            results,
            confirms: vec![],
        })
    }

    /// The jobs queue's name.
    pub fn jobs_queue(&self) -> &str {
        &self.queues.jobs
    }

    /// The run's results queue's name.
    pub fn results_queue(&self) -> &str {
        &self.results
    }

    /// Workers consuming the jobs queue when the run opened.
    pub fn workers(&self) -> u32 {
        self.workers
    }

    /// Publishes one job (persistent, its run in a header, replies to the run's results); its
    /// confirm is awaited by [`Run::confirm_all`].
    pub async fn publish(&mut self, job: &Job) -> Result<(), QueueError> {
        let body =
            serde_json::to_vec(job).map_err(|e| QueueError(format!("encoding a job: {e}")))?;
        let mut headers = FieldTable::default();
        headers.insert(RUN.into(), AMQPValue::LongString(job.run.as_str().into()));
        let props = topology::persistent()
            .with_reply_to(self.results.as_str().into())
            .with_message_id(job.id.as_str().into())
            .with_headers(headers);
        let confirm = self
            .ch
            .basic_publish("", &self.queues.jobs, Default::default(), &body, props)
            .await
            .map_err(amqp("publishing a job"))?;
        self.confirms.push(confirm);
        Ok(())
    }

    /// Waits for the broker's confirm of every job published; a nack is an error.
    pub async fn confirm_all(&mut self) -> Result<(), QueueError> {
        for c in std::mem::take(&mut self.confirms) {
            if !c
                .await
                .map_err(amqp("waiting for a publisher confirm"))?
                .is_ack()
            {
                return Err(QueueError(format!(
                    "the broker refused a job for '{}' (nack)",
                    self.queues.jobs
                )));
            }
        }
        Ok(())
    }

    /// Starts consuming the run's results, at most `prefetch` unacked at a time.
    pub async fn results(&self, prefetch: u16) -> Result<Results, QueueError> {
        let ch = self
            .conn
            .create_channel()
            .await
            .map_err(amqp("opening a channel"))?;
        ch.basic_qos(prefetch.max(1), BasicQosOptions::default())
            .await
            .map_err(amqp("setting the prefetch"))?;
        let consumer = ch
            .basic_consume(
                &self.results,
                "eval",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(amqp("consuming results"))?;
        Ok(Results {
            consumer,
            _channel: ch,
            results: self.results.clone(),
            dead: self.queues.dead.clone(),
        })
    }

    /// What the run waits on, for a message when no result arrived for `quiet`: no worker, or
    /// a backlog.
    pub async fn backlog(&self, pending: usize, quiet: Duration) -> String {
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let jobs = &self.queues.jobs;
        match self
            .ch
            .queue_declare(jobs, passive, FieldTable::default())
            .await
        {
            Ok(q) if q.consumer_count() == 0 => format!(
                "waiting for {pending} results; no worker consumes '{jobs}' ({} jobs ready): start `abserve worker --amqp …`",
                q.message_count()
            ),
            Ok(q) => format!(
                "waiting for {pending} results ({:.0} s without one; {} jobs ready, {} workers)",
                quiet.as_secs_f64(),
                q.message_count(),
                q.consumer_count()
            ),
            Err(e) => format!("waiting for {pending} results; cannot read the jobs queue: {e}"),
        }
    }

    /// Deletes the run's results queue and closes the connection (every result is kept).
    pub async fn finish(self) -> Result<(), QueueError> {
        self.ch
            .queue_delete(&self.results, QueueDeleteOptions::default())
            .await
            .map_err(amqp("deleting the results queue"))?;
        let _ = self.conn.close(200, "eval done").await;
        Ok(())
    }
}

impl Results {
    /// The next result of the run, `None` when none arrived within `wait`. A job the broker
    /// dead-lettered arrives as its error result; a message that is neither is acked and
    /// dropped with a warning.
    pub async fn next(&mut self, wait: Duration) -> Result<Option<Received>, QueueError> {
        loop {
            let d = match tokio::time::timeout(wait, self.consumer.next()).await {
                Ok(Some(d)) => d.map_err(amqp("receiving a result"))?,
                Ok(None) => {
                    return Err(QueueError(format!(
                        "the broker closed the results queue '{}'",
                        self.results
                    )))
                }
                Err(_) => return Ok(None),
            };
            let result = match serde_json::from_slice::<JobResult>(&d.data) {
                Ok(r) => r,
                // a job of this run that the broker dead-lettered (through NAME.dlx): its
                // worker died or lost its connection with it on every delivery
                Err(e) => match serde_json::from_slice::<Job>(&d.data) {
                    Ok(job) => dead_lettered(job, &d.properties, &self.dead),
                    Err(_) => {
                        tracing::warn!(
                            "dropping a message on '{}' that is not a result: {e}",
                            self.results
                        );
                        d.ack(BasicAckOptions::default())
                            .await
                            .map_err(amqp("acknowledging"))?;
                        continue;
                    }
                },
            };
            return Ok(Some(Received {
                result,
                delivery: d,
            }));
        }
    }
}

/// The error result of a job the broker dead-lettered.
fn dead_lettered(job: Job, props: &BasicProperties, dead: &str) -> JobResult {
    // quorum queues count deliveries in x-delivery-count (absent on RabbitMQ before 3.12 when
    // the limit is what dead-lettered it: the limit is then the count)
    let deliveries = match topology::header_int(props, "x-delivery-count") {
        n if n > 0 => n,
        _ => DELIVERY_LIMIT as i64,
    };
    let last = topology::header_str(props, ERROR)
        .map(|e| format!("; its last error: {e}"))
        .unwrap_or_default();
    JobResult {
        id: job.id,
        worker: String::new(),
        attempts: deliveries.max(1) as u32,
        generation: None,
        error: Some(format!(
            "dead-lettered by the broker after {deliveries} deliveries (the delivery limit is {DELIVERY_LIMIT}): \
             a worker died or lost its connection holding it each time{last}; the job waits in '{dead}'"
        )),
    }
}
