//! The guardrail decision for one metric ([`harm`]): is a treatment significantly worse than
//! control on a metric that must not get worse (errors, refusals, thumbs-down)? Built on the
//! always-valid confidence sequence (`sequential.rs`), so the decision may be taken after every
//! unit, however long an experiment runs, and a harmless treatment is stopped with probability
//! ≤ α over its whole life. The evidence ([`Harm`]) is stored with the variant it stopped and
//! shown in its results (`abserve_ab`, whose `guardrail.rs` runs the decision for every active
//! treatment and guardrail of an experiment). `tests/guardrails.rs` measures the decision.

use serde::{Deserialize, Serialize};

use crate::metric::Direction;
use crate::sequential::sequential;
use crate::stats::Summary;

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

/// The harm `treatment` does against `control` on `metric`, if the always-valid sequence at
/// level `alpha` shows it beyond `tolerance` (a relative change of control's mean, ≥ 0).
pub fn harm(
    metric: &str,
    control: &Summary,
    treatment: &Summary,
    direction: Direction,
    tolerance: f64,
    alpha: f64,
    tuning: f64,
) -> Option<Harm> {
    let s = sequential(control, treatment, alpha, tuning)?;
    let threshold = tolerance.max(0.0) * control.mean.abs();
    let harmful = match direction {
        Direction::Lower => s.ci_low > threshold,
        Direction::Higher => s.ci_high < -threshold,
    };
    harmful.then(|| Harm {
        metric: metric.to_string(),
        units: (control.n + treatment.n) as u64,
        diff: s.diff,
        ci_low: s.ci_low,
        ci_high: s.ci_high,
        p_value: s.p_value,
        threshold,
        at: 0.0,
    })
}
