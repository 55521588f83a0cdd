//! The job queue of offline evals on RabbitMQ (see docs/scale-out.md):
//!
//! - [`topology`]: the queues and the dead-letter exchange both sides declare alike, publishing
//!   with confirms, the headers jobs carry;
//! - [`run`]: one eval run's side: its jobs published with confirms, its results read (jobs the
//!   broker dead-lettered included), each acked once the caller keeps it;
//! - [`ledger`]: each job's result committed once per job id before its ack (`worker --store`);
//! - [`worker`]: `abserve worker`, which answers jobs on the one engine of its process
//!   (`abserve_models::call`, the same path eval runs in process), a result durable before
//!   every ack.
//!
//! The messages themselves ([`abserve_protocol::jobs`]) are protocol types: `abserve eval
//! --amqp` (`abserve_eval`) makes them and scores the results. This is the one crate that talks
//! to the broker (the only one that depends on `lapin`).

pub mod ledger;
pub mod run;
pub mod topology;
pub mod worker;

/// The broker client, for tests that look into the broker itself (queue depths, dead letters)
/// without a second copy of the dependency.
pub use lapin;

/// A broker or encoding failure, with what was being done.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("job queue: {0}")]
pub struct QueueError(pub String);
