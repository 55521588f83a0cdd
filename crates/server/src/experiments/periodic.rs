//! The experiments' periodic work, owned by one task (every `--guardrail-interval`). Each pass
//! reads every running experiment's results once (per unit; an experiment that is not running
//! once, when first seen) and from that one read:
//! - **sample ratio**: its SRM p-value goes to `/metrics` (`abserve_experiment_srm_p_value`;
//!   NaN until it has units);
//! - **bandits** (`mode = "bandit"`): its units' variants are read into the sticky table
//!   (`AbState::stick`), so a unit routed by another replica, or before a restart, keeps its
//!   variant; when an update is due (`update_seconds` after the last), the next state comes
//!   from the arms' estimates in the results (`abserve_ab::next_bandit`: the winner when the
//!   stopping rule names one, else the next period's Thompson weights), is stored with the
//!   experiment so every replica routes by it, and logged;
//! - **guardrails** (`abserve_ab::check_guardrails`: the always-valid test, α divided among
//!   active treatments × guardrails). A treatment found significantly worse on a guardrail is
//!   stopped: its evidence (metric, units, difference and interval, p-value, threshold, time)
//!   is stored with the experiment's definition, so every replica routes by it (`live`
//!   reloads); routing serves the control to every unit the stopped variant's bucket would
//!   take and records no exposure for them (`routing`); it is logged, counted in
//!   `abserve_guardrail_stops_total` (alert rule in deploy/prometheus) and
//!   `abserve_experiment_variants_stopped`, and shown in `/results` and the dashboard.
//!
//! - **retention**: sampled conversations older than their experiment's `retention_days` are
//!   deleted (`samples::sweep_samples`).
//!
//! A pass whose store read fails leaves the last values and tries again at the next.

use std::collections::HashSet;
use std::sync::Arc;

use abserve_ab::{Experiment, Results, Status};
use abserve_statistics::Harm;

use super::{AbState, ControlPlane};

impl ControlPlane {
    /// Runs the experiments' periodic work every `interval` (see the module).
    pub(super) fn spawn_periodic(self: &Arc<Self>) {
        let st = self.clone();
        tokio::spawn(async move {
            let Some(ab) = st.ab.as_ref() else { return };
            let mut tick = tokio::time::interval(st.interval);
            // experiments not running, read once: their results no longer change
            let mut settled: HashSet<String> = HashSet::new();
            loop {
                tick.tick().await;
                for e in ab.list() {
                    let running = e.status == Status::Running;
                    if !running && settled.contains(&e.name) {
                        continue;
                    }
                    let Ok(r) = ab.store().results(&e).await else {
                        continue;
                    };
                    if !running {
                        settled.insert(e.name.clone());
                    } else {
                        settled.remove(&e.name);
                    }
                    pass(&st, ab, &e, &r, running).await;
                }
                st.sweep_samples(super::unix_now()).await;
            }
        });
    }
}

/// One experiment's turn of a pass, from its results `r`.
async fn pass(st: &ControlPlane, ab: &AbState, e: &Experiment, r: &Results, running: bool) {
    // NaN until the experiment has units to test
    let p = r.srm.as_ref().map_or(f64::NAN, |s| s.p_value);
    st.metrics
        .experiment_srm
        .with_label_values(&[e.name.as_str()])
        .set(p);
    if !running {
        return;
    }
    if let Some(b) = &r.bandit {
        bandit(ab, e, b).await;
    }
    if !e.guardrails.is_empty() {
        for (variant, harm) in abserve_ab::check_guardrails(e, r) {
            stop(st, ab, &e.name, &variant, harm).await;
        }
    }
    let stopped = ab.get(&e.name).map_or(0, |e| {
        e.variants.iter().filter(|v| v.stopped.is_some()).count()
    });
    st.metrics
        .experiment_stopped
        .with_label_values(&[e.name.as_str()])
        .set(stopped as i64);
}

/// A bandit's turn: its units kept on their variants, then its update when one is due.
async fn bandit(ab: &AbState, e: &Experiment, b: &abserve_statistics::bandit::BanditResults) {
    if let Ok(units) = ab.store().first_variants(&e.name).await {
        for (unit, variant) in units {
            ab.stick(&e.name, &unit, &variant);
        }
    }
    let now = super::unix_now();
    let estimates: Vec<_> = b.arms.iter().map(|a| a.estimate).collect();
    let Some(next) = abserve_ab::next_bandit(e, &estimates, now) else {
        return;
    };
    if let Err(err) = ab.store().put_experiment(&next).await {
        tracing::error!("bandit '{}': storing its update failed: {err}", e.name);
        return;
    }
    let state = next.bandit_state.clone().unwrap_or_default();
    match &state.winner {
        Some(w) => tracing::warn!(
            "bandit '{}': winner '{}' at {} units (Holm-adjusted always-valid p-values {:?}); every unit gets it from now on",
            e.name, w.variant, w.units, w.p_values
        ),
        None => tracing::info!(
            "bandit '{}': period {} weights {:?}",
            e.name,
            state.periods.len(),
            state.periods.last().map(|p| p.weights.clone()).unwrap_or_default()
        ),
    }
    ab.insert(next);
}

/// Stores `variant`'s stop with its evidence (on the experiment as it is now), then routes by it.
async fn stop(st: &ControlPlane, ab: &AbState, experiment: &str, variant: &str, mut harm: Harm) {
    let Some(mut e) = ab.get(experiment) else {
        return;
    };
    let Some(v) = e
        .variants
        .iter_mut()
        .find(|v| v.id == variant && v.stopped.is_none())
    else {
        return;
    };
    harm.at = super::unix_now();
    v.stopped = Some(harm.clone());
    if let Err(err) = ab.store().put_experiment(&e).await {
        tracing::error!("storing the guardrail stop of {experiment}/{variant} failed: {err}");
        st.metrics.store_error("experiment");
        return;
    }
    ab.insert(e);
    st.metrics.guardrail_stops.inc();
    tracing::warn!(
        "guardrail: experiment '{experiment}': variant '{variant}' stopped: {} is worse than control by {:.4} (always-valid interval [{:.4}, {:.4}], tolerated {:.4}) at {} units, p = {:.2e}",
        harm.metric, harm.diff, harm.ci_low, harm.ci_high, harm.threshold, harm.units, harm.p_value
    );
}
