//! The queues the jobs of offline evals travel on (the messages: `abserve_protocol::jobs`).
//! `abserve eval --amqp` publishes jobs (`abserve_eval`), `abserve worker` runs them
//! ([`crate::worker`]).
//!
//! Topology, all durable, declared alike by both sides (a mismatch is refused by the broker):
//! - `NAME` (default `abserve.jobs`): a quorum queue of jobs, one per row × variant, persistent,
//!   published with publisher confirms. Dead-letters to the exchange `NAME.dlx` after
//!   [`DELIVERY_LIMIT`] deliveries: a job that kills its worker every time cannot loop forever.
//! - `NAME.dlx`: a headers exchange. It routes every job the broker dead-letters to `NAME.dead`,
//!   and to the results queue of the job's own run (by its [`RUN`] header), so that the eval
//!   hears of it and reports it as that row × variant's error instead of waiting for it.
//! - `NAME.dead`: the dead-letter queue. A job lands there with its error in the
//!   `x-abserve-error` header once it failed [`crate::worker::Options::max_failures`] times,
//!   or by the delivery limit. Nothing consumes it: it is for operators.
//! - `NAME.results.RUN`: one eval run's results (the jobs' `reply_to`), deleted when the run has
//!   them all.
//!
//! Queues declared by abserve before `NAME.dlx` existed dead-letter to `NAME.dead` directly; the
//! broker refuses the new arguments for them (PRECONDITION_FAILED): delete the jobs queue once
//! it is empty, and the next eval or worker declares it anew.
//!
//! Guarantees: a job is acked only after its result was confirmed by the broker (and, with
//! `--store`, committed), so a worker killed at any point loses nothing: its unacked jobs are
//! redelivered. A redelivered job may then be answered twice; the eval keeps the first result
//! per job id (and the ledger, its primary key), so every row × variant counts once.

use lapin::options::{
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::QueueError;

/// Deliveries of one job before the broker dead-letters it (worker crashes included).
pub const DELIVERY_LIMIT: i32 = 10;
/// The header that carries a job's failures so far (republished on each failure).
pub const FAILURES: &str = "x-abserve-failures";
/// The header that carries a job's last error (on retries and in the dead-letter queue).
pub const ERROR: &str = "x-abserve-error";
/// The header that carries a job's eval run: the dead-letter exchange routes on it.
pub const RUN: &str = "x-abserve-run";

/// The queues of one job queue name.
#[derive(Debug, Clone)]
pub struct Queues {
    pub jobs: String,
    pub dead: String,
    /// The dead-letter exchange (headers).
    pub dlx: String,
}

impl Queues {
    pub fn new(name: &str) -> Queues {
        Queues {
            jobs: name.to_string(),
            dead: format!("{name}.dead"),
            dlx: format!("{name}.dlx"),
        }
    }

    /// The results queue of one eval run.
    pub fn results(&self, run: &str) -> String {
        format!("{}.results.{run}", self.jobs)
    }

    /// Declares the jobs and dead-letter queues and the dead-letter exchange (idempotent with
    /// equal arguments).
    pub async fn declare(&self, ch: &Channel) -> Result<lapin::Queue, QueueError> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let exchange = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.exchange_declare(
            &self.dlx,
            ExchangeKind::Headers,
            exchange,
            FieldTable::default(),
        )
        .await
        .map_err(amqp("declaring the dead-letter exchange"))?;
        ch.queue_declare(&self.dead, durable, FieldTable::default())
            .await
            .map_err(amqp("declaring the dead-letter queue"))?;
        // no header to match: every dead letter
        ch.queue_bind(
            &self.dead,
            &self.dlx,
            "",
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(amqp("binding the dead-letter queue"))?;
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongInt(DELIVERY_LIMIT),
        );
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(self.dlx.as_str().into()),
        );
        ch.queue_declare(&self.jobs, durable, args)
            .await
            .map_err(amqp("declaring the jobs queue"))
    }

    /// Routes the jobs of `run` that the broker dead-letters to `results` as well.
    pub async fn bind_dead_letters(
        &self,
        ch: &Channel,
        results: &str,
        run: &str,
    ) -> Result<(), QueueError> {
        let mut args = FieldTable::default();
        args.insert("x-match".into(), AMQPValue::LongString("all".into()));
        args.insert(RUN.into(), AMQPValue::LongString(run.into()));
        ch.queue_bind(results, &self.dlx, "", QueueBindOptions::default(), args)
            .await
            .map_err(amqp(
                "binding the results queue to the dead-letter exchange",
            ))
    }
}

/// Connects and opens a channel in publisher-confirm mode.
pub async fn connect(url: &str) -> Result<(Connection, Channel), QueueError> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| QueueError(format!("cannot connect to {}: {e}", without_password(url))))?;
    let ch = conn
        .create_channel()
        .await
        .map_err(amqp("opening a channel"))?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(amqp("enabling publisher confirms"))?;
    Ok((conn, ch))
}

/// Persistent JSON message properties.
pub fn persistent() -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(ShortString::from("application/json"))
}

/// Publishes and waits for the broker's confirm; a nack is an error.
pub async fn publish_confirmed(
    ch: &Channel,
    queue: &str,
    body: &[u8],
    props: BasicProperties,
) -> Result<(), QueueError> {
    let confirm = ch
        .basic_publish("", queue, Default::default(), body, props)
        .await
        .map_err(amqp("publishing"))?
        .await
        .map_err(amqp("waiting for the publisher confirm"))?;
    if !confirm.is_ack() {
        return Err(QueueError(format!(
            "the broker refused a message for '{queue}' (nack)"
        )));
    }
    Ok(())
}

/// A string header of a delivery.
pub fn header_str(props: &BasicProperties, name: &str) -> Option<String> {
    match props.headers().as_ref().and_then(|h| h.inner().get(name)) {
        Some(AMQPValue::LongString(s)) => Some(s.to_string()),
        Some(AMQPValue::ShortString(s)) => Some(s.to_string()),
        _ => None,
    }
}

/// An integer header of a delivery (0 when absent).
pub fn header_int(props: &BasicProperties, name: &str) -> i64 {
    match props.headers().as_ref().and_then(|h| h.inner().get(name)) {
        Some(AMQPValue::LongInt(n)) => *n as i64,
        Some(AMQPValue::LongLongInt(n)) => *n,
        Some(AMQPValue::ShortInt(n)) => *n as i64,
        Some(AMQPValue::LongUInt(n)) => *n as i64,
        _ => 0,
    }
}

pub fn amqp(what: &'static str) -> impl Fn(lapin::Error) -> QueueError {
    move |e| QueueError(format!("{what}: {e}"))
}

/// The url without its password.
pub fn without_password(url: &str) -> String {
    abserve_protocol::location::url_without_password(url).unwrap_or_else(|| url.to_string())
}
