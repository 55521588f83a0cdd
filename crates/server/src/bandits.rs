//! Bandits, run by the guardrail loop (`guardrails.rs`, every `--guardrail-interval`): for each
//! running experiment with `mode = "bandit"`,
//! - its units' variants are read from the store into the sticky table (`AbState::stick`), so a
//!   unit routed by another replica, or before a restart, keeps its variant;
//! - when an update is due (`update_seconds` after the last), the store computes the next state
//!   (`Store::update_bandit`: the winner when the stopping rule names one, else the next
//!   period's Thompson weights), which is stored with the experiment so every replica routes by
//!   it, and logged.

use abserve_ab::Experiment;

use crate::abstate::AbState;

/// One bandit's turn of the loop.
pub(crate) async fn update(ab: &AbState, e: &Experiment) {
    if e.bandit_settings().is_none() {
        return;
    }
    if let Ok(units) = ab.store().first_variants(&e.name).await {
        for (unit, variant) in units {
            ab.stick(&e.name, &unit, &variant);
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let next = match ab.store().update_bandit(e, now).await {
        Ok(Some(next)) => next,
        Ok(None) => return,
        Err(err) => {
            tracing::warn!("bandit '{}': update failed: {err}", e.name);
            return;
        }
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
