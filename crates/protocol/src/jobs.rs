//! The messages of the job queue of offline evals (RabbitMQ; the topology is `abserve_queue`'s):
//! `abserve eval --amqp` publishes a [`Job`] per row × variant, `abserve worker` answers each
//! with a [`JobResult`] on the run's results queue.

use serde::{Deserialize, Serialize};

use crate::calls::{Call, Generation};

/// One row × variant to answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    /// `RUN/ROW/VARIANT`: unique per eval run, the key results are deduplicated by.
    pub id: String,
    pub run: String,
    pub row: String,
    pub variant: String,
    pub call: Call,
}

/// A job's answer or its final error.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobResult {
    pub id: String,
    /// The worker that answered (host and pid).
    pub worker: String,
    /// Tries it took (failures before this one + 1).
    pub attempts: u32,
    pub generation: Option<Generation>,
    pub error: Option<String>,
}
