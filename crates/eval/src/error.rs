//! Why an eval could not run ([`EvalError`]) and why one answer could not be scored
//! ([`ScoreError`], recorded in `results.jsonl` beside the answer; the run goes on).

use std::path::PathBuf;

use abserve_protocol::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line of `results.jsonl` that is not a result (a file from another tool or version).
    #[error("{} line {line}: {message}", path.display())]
    Log {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// The eval file: its TOML, its experiment or its scorers.
    #[error("{0}")]
    Config(String),
    /// The dataset: its format, no usable row, a variable no row has.
    #[error("{0}")]
    Dataset(String),
    /// The endpoint's model could not be discovered.
    #[error("{0}; pass --remote-model")]
    NoModel(#[source] ClientError),
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The job queue (RabbitMQ): connecting, declaring, publishing, consuming.
    #[error("job queue: {0}")]
    Queue(String),
    /// The worker's result store.
    #[error(transparent)]
    Store(#[from] abserve_ab::StoreError),
    /// The HTML report's template failed to render.
    #[error("report template: {0}")]
    Report(String),
}

impl EvalError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> EvalError {
        let path = path.into();
        move |source| EvalError::Io { path, source }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScoreError {
    /// The scorer's `expected` template did not render for this row.
    #[error("{0}")]
    Template(String),
    #[error("invalid JSON schema: {0}")]
    Schema(String),
    #[error("no latency")]
    NoLatency,
    #[error("cannot run {command}: {message}")]
    Spawn { command: String, message: String },
    #[error("{command} timed out after {seconds:.1} s")]
    Timeout { command: String, seconds: f64 },
    #[error("{command} exited with {status}: {stderr}")]
    Exit {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{command} printed no number: {output:?}")]
    Output { command: String, output: String },
    #[error("the judge scores pairs, not single answers")]
    Pair,
}

impl From<abserve_queue::QueueError> for EvalError {
    fn from(e: abserve_queue::QueueError) -> Self {
        EvalError::Queue(e.0)
    }
}
