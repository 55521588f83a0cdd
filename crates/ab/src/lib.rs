//! abserve's A/B layer: experiment definitions, GrowthBook-compatible assignment, what a variant
//! does to a request, durable storage of exposures and outcome events, and the statistics of
//! results. No HTTP here, no model.
//!
//! - `experiment`: definitions (TOML/JSON), validated; templates rendered with minijinja;
//! - `stop`: the evidence a guardrail stopped a treatment with;
//! - `guardrail`: whether a treatment is significantly worse on a guardrail metric (always
//!   valid), for every active treatment of an experiment;
//! - `metric`: metric definitions (aggregation per unit, direction, percentile cap);
//! - `assign`: GrowthBook's hashing and bucket ranges, equal to its SDKs on fixtures;
//! - `variant`: a variant applied to a conversation, an input or a dataset row, and its sampling;
//! - `store`: SQLite (embedded default) or PostgreSQL (shared by replicas) through sqlx, versioned
//!   migrations, idempotent event batches, results aggregated by the database;
//! - `testing`: fresh stores on both backends for tests;
//! - `stats` (Welch, SRM) and `paired` (paired t, McNemar, sign test, quantiles), pinned to
//!   scipy/statsmodels fixtures;
//! - statistics that stay valid when people peek and compare many things, pinned to GrowthBook's
//!   `gbstats`, `confseq` and statsmodels: `sequential` (always-valid confidence sequences),
//!   `bayes` (chance to beat control, uplift, risk), `adjust` (Holm, Benjamini–Hochberg),
//!   `ratio` (ratio metrics by the delta method).

mod adjust;
mod assign;
pub mod bandit;
mod bandit_rules;
mod bayes;
mod cuped;
mod experiment;
mod guardrail;
mod metric;
mod paired;
mod ratio;
mod sequential;
mod stats;
mod stop;
mod store;
pub mod testing;
mod variant;

pub use adjust::{benjamini_hochberg, holm};
pub use assign::{assign, bucket_ranges, choose_variation, fnv1a32, hash};
pub use bayes::{bayesian, bayesian_scaled, Bayesian};
pub use cuped::{cuped, theta, Cuped, PrePost};
pub use experiment::{
    parse_file, parse_one, render, render_row, template_fields, Experiment, ExperimentFile,
    Guardrail, Invalid, RatioMetric, Status, Variant, AUTOMATIC_METRICS, MAX_RENDERED_BYTES,
    TEMPLATE_FUEL,
};
pub use guardrail::{check as check_guardrails, harm, Harm};
pub use metric::{Aggregation, Direction, MetricDef};
pub use paired::{
    binomial_two_sided, mcnemar, paired_t, quantile, quantiles, sign_test, McNemar, PairedT,
    SignTest,
};
pub use ratio::RatioMoments;
pub use sequential::{half_width, sequential, Sequential, DEFAULT_TUNING};
pub use stats::{
    from_moments, srm, summarize, welch, welch_summaries, Comparison, SrmCheck, Summary,
};
pub use store::{
    url_without_password, Adjusted, Analysis, Arm, BanditResults, Database, Exposure, HistoryPoint,
    Location, MetricResult, OutcomeEvent, RatioParts, RecordedExposure, Results, Store,
    StoreCondition, StoreError, VariantResult, VariantState, ALPHA, CHANNEL,
};
pub use variant::VariantError;
