//! abserve's A/B layer: experiment definitions, GrowthBook-compatible assignment, what a variant
//! does to a request, durable storage of exposures and outcome events, and the statistics of
//! results. No HTTP here, no model.
//!
//! - `experiment`: definitions (TOML/JSON), validated; templates rendered with minijinja;
//! - `assign`: GrowthBook's hashing and bucket ranges, equal to its SDKs on fixtures;
//! - `variant`: a variant applied to a conversation, an input or a dataset row, and its sampling;
//! - `store`: SQLite (embedded default) or PostgreSQL (shared by replicas) through sqlx, versioned
//!   migrations, idempotent event batches, results aggregated by the database;
//! - `testing`: fresh stores on both backends for tests;
//! - `stats` (Welch, SRM) and `paired` (paired t, McNemar, sign test, quantiles), pinned to
//!   scipy/statsmodels fixtures.

mod assign;
mod experiment;
mod paired;
mod stats;
mod store;
pub mod testing;
mod variant;

pub use assign::{assign, bucket_ranges, choose_variation, fnv1a32, hash};
pub use experiment::{
    parse_file, render, render_row, template_fields, Experiment, ExperimentFile, Invalid, Status,
    Variant, MAX_RENDERED_BYTES, TEMPLATE_FUEL,
};
pub use paired::{
    binomial_two_sided, mcnemar, paired_t, quantile, quantiles, sign_test, McNemar, PairedT,
    SignTest,
};
pub use stats::{
    from_moments, srm, summarize, welch, welch_summaries, Comparison, SrmCheck, Summary,
};
pub use store::{
    url_without_password, Backend, Exposure, Location, MetricResult, OutcomeEvent, Results, Store,
    StoreCondition, StoreError, VariantResult, CHANNEL,
};
pub use variant::{Message, Sampling, VariantError};
