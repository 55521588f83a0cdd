//! The evidence a guardrail stopped a treatment with ([`Harm`]), stored with the variant it
//! stopped (`experiment.rs`) and shown in its results (`store/results.rs`); `guardrail.rs`
//! finds it.

use serde::{Deserialize, Serialize};

/// Why a treatment is stopped: the metric, at how many units, the difference and its
/// always-valid interval, the always-valid p-value against no difference, and the tolerated
/// change the interval passed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Harm {
    pub metric: String,
    pub units: u64,
    pub diff: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub p_value: f64,
    pub threshold: f64,
    /// When the treatment was stopped, seconds since the Unix epoch (0 until it is).
    #[serde(default)]
    pub at: f64,
}
