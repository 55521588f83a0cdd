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
//! An experiment lists its guardrails (`guardrails = ["error", { metric = "thumbs_down",
//! tolerance = 0.1 }]`, default `["error"]`); [`check`] runs the decision for every active
//! treatment and guardrail of a results object, α divided among them. The server runs it
//! continuously and stops what it finds (`abserve_server`'s `guardrails.rs`). The simulations in
//! `tests/guardrails.rs` measure the decision itself.

use crate::experiment::Experiment;
use crate::metric::Direction;
use crate::sequential::{sequential, DEFAULT_TUNING};
use crate::stats::Summary;
pub use crate::stop::Harm;
use crate::store::{Results, ALPHA};

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

/// Every active treatment of `r` that one of `e`'s guardrails finds harmful, with the harm
/// found first (in the order the guardrails are listed). α is divided among the active
/// treatments × guardrails (Bonferroni), so the chance that any harmless treatment of the
/// experiment is stopped stays ≤ α.
pub fn check(e: &Experiment, r: &Results) -> Vec<(String, Harm)> {
    let control = &r.control;
    let active: Vec<_> = r
        .variants
        .iter()
        .filter(|v| !v.is_control && v.stopped.is_none())
        .collect();
    let comparisons = (active.len() * e.guardrails.len()).max(1);
    let alpha = ALPHA / comparisons as f64;
    let tuning = e.sequential_tuning.unwrap_or(DEFAULT_TUNING);
    let Some(c) = r.variants.iter().find(|v| &v.id == control) else {
        return vec![];
    };
    let mut found = vec![];
    for v in active {
        for g in &e.guardrails {
            let (Some(cm), Some(tm)) = (c.metrics.get(&g.metric), v.metrics.get(&g.metric)) else {
                continue;
            };
            let direction = e.direction_of(&g.metric);
            if let Some(h) = harm(
                &g.metric,
                &cm.summary,
                &tm.summary,
                direction,
                g.tolerance,
                alpha,
                tuning,
            ) {
                found.push((v.id.clone(), h));
                break;
            }
        }
    }
    found
}
