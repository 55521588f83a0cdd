//! Guardrails of an experiment: [`check`] runs the decision of `abserve_statistics::harm` (is a
//! treatment significantly worse than control on a metric that must not get worse, by the
//! always-valid confidence sequence) for every active treatment and guardrail of a results
//! object. With several treatments and guardrails α is divided among the comparisons
//! (Bonferroni), so the chance that any harmless treatment is stopped stays ≤ α.
//!
//! An experiment lists its guardrails (`guardrails = ["error", { metric = "thumbs_down",
//! tolerance = 0.1 }]`, default `["error"]`). The server runs the check continuously and stops
//! what it finds (`abserve_server`'s `periodic.rs`).

use abserve_statistics::{harm, Harm, ALPHA, DEFAULT_TUNING};

use crate::experiment::Experiment;
use crate::store::Results;

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
