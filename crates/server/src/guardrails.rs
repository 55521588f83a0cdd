//! Guardrails, run continuously: every `--guardrail-interval`, each running experiment's
//! results (per unit) are checked by `abserve_ab::check_guardrails` (the always-valid test, α
//! divided among active treatments × guardrails). A treatment found significantly worse on a
//! guardrail is stopped:
//! - its evidence (metric, units, difference and interval, p-value, threshold, time) is stored
//!   with the experiment's definition, so every replica routes by it (`abstate` reloads);
//! - routing serves the control to every unit the stopped variant's bucket would take, and
//!   records no exposure for them (`experiments::route`): its weight is 0 from then on, and the
//!   split is checked over the active variants;
//! - it is logged, counted in `abserve_guardrail_stops_total` (alert rule in deploy/prometheus)
//!   and `abserve_experiment_variants_stopped`, and shown in `/results` and the dashboard.

use std::sync::Arc;

use abserve_ab::Status;
use abserve_statistics::Harm;

use crate::abstate::AbState;
use crate::state::AppState;

impl AppState {
    /// Checks every running experiment's guardrails every `config.guardrail_interval`.
    pub fn spawn_guardrails(self: &Arc<Self>) {
        let st = self.clone();
        tokio::spawn(async move {
            let Some(ab) = st.ab.as_ref() else { return };
            let mut tick = tokio::time::interval(st.config.guardrail_interval);
            loop {
                tick.tick().await;
                for e in ab.list() {
                    if e.status == Status::Running {
                        crate::bandits::update(ab, &e).await;
                    }
                    if e.status == Status::Running && !e.guardrails.is_empty() {
                        if let Ok(r) = ab.store().results(&e).await {
                            for (variant, harm) in abserve_ab::check_guardrails(&e, &r) {
                                stop(&st, ab, &e.name, &variant, harm).await;
                            }
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
            }
        });
    }
}

/// Stores `variant`'s stop with its evidence (on the experiment as it is now), then routes by it.
async fn stop(st: &AppState, ab: &AbState, experiment: &str, variant: &str, mut harm: Harm) {
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
    harm.at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
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
