//! `abserve eval`: offline A/B runs. Every variant of an experiment answers every row of a
//! dataset on one shared model (in-process engine or any OpenAI-compatible endpoint), results
//! stream to a resumable JSONL file, scorers grade each answer, paired statistics compare each
//! variant with control, and the outcome is written as a terminal table, JSON, Markdown and a
//! self-contained HTML report.
//!
//! Order of work: `config` (the experiment and scorers) and `dataset` (rows) are read and
//! checked; `runner` asks `target` for every row × variant (resumable through `results`),
//! `scorers` and `judge` grade the answers; `analysis` computes the paired statistics;
//! `report_md` and `report_html` write the reports.
//!
//! Scale-out: with `--amqp`, `queued` publishes the rows × variants as jobs on RabbitMQ (the
//! messages are `abserve_protocol::jobs`, the topology `abserve_queue::topology`) and `abserve
//! worker` (`abserve_queue::worker`) answers them on other processes or machines; results come
//! back to the same log, scorers and reports.

mod analysis;
mod config;
mod dataset;
mod error;
mod judge;
mod progress;
mod queued;
mod report_html;
mod report_md;
mod results;
mod row_call;
mod runner;
mod scorers;
mod target;

pub use analysis::{judge_warning, summarize_run, table, RunFacts, Summary};
pub use config::{EvalConfig, Scorer, ScorerKind, DEFAULT_JUDGE_PROMPT};
pub use dataset::Dataset;
pub use error::{EvalError, ScoreError};
pub use judge::both_orders;
pub use queued::QueueSpec;
pub use results::ResultRow;
pub use runner::{check, run, Options, Outcome, Source};
pub use target::{Call, CallError, Capacity, Generation, Http, Target};

/// The Markdown report of a summary.
pub fn report_md(s: &Summary) -> String {
    report_md::render(s)
}

/// The self-contained HTML report (summary, every answer and judgment).
pub use report_html::render as report_html;
