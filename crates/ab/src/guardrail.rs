//! The guardrail decision: is a treatment significantly worse than control on a metric that
//! must not get worse (errors, refusals, thumbs-down)? Built on the always-valid confidence
//! sequence (`sequential.rs`), so the decision may be taken after every unit, however long an
//! experiment runs, and a harmless treatment is stopped with probability ≤ α over its whole
//! life.
//!
//! A treatment is harmful on a metric when the sequence lies entirely on the bad side of the
//! tolerated change: for a lower-is-better metric, `ci_low > tolerance · |control mean|`; for
//! higher-is-better, `ci_high < −tolerance · |control mean|`. With several treatments and
//! guardrails the caller divides α among the comparisons (Bonferroni), so the chance that any
//! harmless treatment is stopped stays ≤ α.
//!
//! Not wired into the server yet (issue 30's guardrails: the continuous check, the stop, its
//! record, `/results` state, `/metrics` and the dashboard are still to build); the simulations
//! in `tests/guardrails.rs` measure the decision itself.

use serde::Serialize;

use crate::metric::Direction;
use crate::sequential::sequential;
use crate::stats::Summary;

/// Why a treatment is stopped: the metric, at how many units, the difference and its
/// always-valid interval, the always-valid p-value against no difference, and the tolerated
/// change the interval passed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Harm {
    pub metric: String,
    pub units: u64,
    pub diff: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub p_value: f64,
    pub threshold: f64,
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
    })
}
