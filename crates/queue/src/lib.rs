//! The job queue of offline evals on RabbitMQ (see docs/scale-out.md):
//!
//! - [`topology`]: the queues and the dead-letter exchange both sides declare alike, publishing
//!   with confirms, the headers jobs carry;
//! - [`worker`]: `abserve worker`, which answers jobs on the one engine of its process
//!   (`abserve_engine::call`, the same path eval runs in process), a result durable before
//!   every ack.
//!
//! The messages themselves ([`abserve_protocol::jobs`]) are protocol types: `abserve eval
//! --amqp` (`abserve_eval`) publishes them and reads the results.

pub mod topology;
pub mod worker;

/// A broker or encoding failure, with what was being done.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("job queue: {0}")]
pub struct QueueError(pub String);
