//! abserve's statistics: pure functions of numbers, no I/O (no database, no runtime), each pinned
//! to a reference implementation on committed fixtures.
//!
//! - `assign`: GrowthBook's hashing and bucket ranges, equal to its SDKs on fixtures;
//! - `stats` (Welch, SRM, the level [`ALPHA`]) and `paired` (paired t, McNemar, sign test,
//!   quantiles), pinned to scipy/statsmodels;
//! - statistics that stay valid when people peek and compare many things, pinned to GrowthBook's
//!   `gbstats`, `confseq` and statsmodels: `sequential` (always-valid confidence sequences),
//!   `bayes` (chance to beat control, uplift, risk), `adjust` (Holm, Benjamini–Hochberg),
//!   `ratio` (ratio metrics by the delta method), `cuped` (variance reduction by a pre-period
//!   covariate);
//! - `metric`: what a metric is per unit (aggregation, direction, percentile cap);
//! - `harm`: the guardrail decision for one metric (always valid);
//! - `bandit`: Thompson sampling over periods, unbiased estimates, the stopping rule.

mod adjust;
mod assign;
pub mod bandit;
mod bayes;
mod cuped;
mod harm;
mod metric;
mod paired;
mod ratio;
mod sequential;
mod stats;

pub use adjust::{benjamini_hochberg, holm};
pub use assign::{assign, bucket_ranges, choose_variation, fnv1a32, hash};
pub use bandit::{Arm, BanditResults};
pub use bayes::{bayesian, bayesian_scaled, Bayesian};
pub use cuped::{cuped, theta, Cuped, PrePost};
pub use harm::{harm, Harm};
pub use metric::{winsorise, Aggregation, Direction, MetricDef, UnitValues, DEFAULT_LOOKBACK_DAYS};
pub use paired::{
    binomial_two_sided, mcnemar, paired_t, quantile, quantiles, sign_test, McNemar, PairedT,
    SignTest,
};
pub use ratio::RatioMoments;
pub use sequential::{half_width, sequential, Sequential, DEFAULT_TUNING};
pub use stats::{
    from_moments, srm, summarize, welch, welch_summaries, Comparison, SrmCheck, Summary, ALPHA,
};
