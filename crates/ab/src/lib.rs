//! abserve's A/B layer: experiment definitions, what a variant does to a request, durable storage
//! of exposures and outcome events, and results computed from them with the statistics of
//! `abserve_statistics` (assignment, tests, CUPED, bandits: pure functions, their own crate). No
//! HTTP here, no model.
//!
//! - `experiment`: definitions (TOML/JSON), validated (`bandit_rules`, `ratio_rules`);
//!   templates rendered with minijinja;
//! - `fanout`: which variants answer a fan-out input (`fanout_rate`) and their spend caps;
//! - `variant`: a variant applied to a conversation, an input or a dataset row, and its sampling;
//! - `store`: SQLite (embedded default) or PostgreSQL (shared by replicas) through sqlx, versioned
//!   migrations, idempotent event batches, results aggregated by the database;
//! - `samples`: which units' conversations are kept, for how long, and their redaction;
//! - `guardrail`: the guardrail decision for every active treatment of an experiment;
//! - `testing`: fresh stores on both backends for tests.

mod bandit_rules;
mod experiment;
mod fanout;
mod guardrail;
mod ratio_rules;
mod samples;
mod store;
pub mod testing;
mod variant;

pub use experiment::{
    parse_file, parse_one, render, render_row, template_fields, Experiment, ExperimentFile,
    Guardrail, Invalid, RatioMetric, Status, Variant, AUTOMATIC_METRICS, MAX_RENDERED_BYTES,
    TEMPLATE_FUEL,
};
pub use fanout::{utc_day, SPEND_CAP_HELP};
pub use guardrail::check as check_guardrails;
pub use samples::{answer_json, asked_json, Redactor, SampleRules};
pub use store::{
    next_bandit, Adjusted, Analysis, AuditEntry, Database, Erased, EvalRun, Exposure, HistoryPoint,
    MetricResult, OutcomeEvent, RatioParts, RecordedExposure, Results, Sample, SampleQuery, Store,
    StoreCondition, StoreError, VariantResult, VariantState, CHANNEL, EVAL_HEARTBEAT,
};
pub use variant::{Asked, Prompt, VariantError};
