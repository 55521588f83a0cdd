//! Why a load test could not run (what it measured, failures included, is the report).

use abserve_protocol::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("give --duration or --requests (or both): a load test is bounded")]
    Unbounded,
    #[error("--rate must be a positive number of requests per second, got {0}")]
    Rate(f64),
    /// The target's model could not be discovered from `GET /v1/models`.
    #[error("{0}; pass --model-name")]
    NoModel(#[source] ClientError),
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A client task panicked or was cancelled.
    #[error("a load-test client task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}
