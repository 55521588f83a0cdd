//! An experiment's bandit (`mode = "bandit"`, `bandit.rs` for the statistics): its settings,
//! its current weights and the checks of its definition.

use crate::experiment::{Experiment, Invalid, AUTOMATIC_METRICS};
use abserve_statistics::bandit::BanditSettings;
use abserve_statistics::bandit::Mode;

impl Experiment {
    /// A bandit's settings (its own or the defaults); `None` for a fixed experiment.
    pub fn bandit_settings(&self) -> Option<BanditSettings> {
        (self.mode == Mode::Bandit).then(|| self.bandit.unwrap_or_default())
    }

    /// A bandit's current weights: its winner's alone once named, else its last period's
    /// (`None` before its first update, or for a fixed experiment).
    pub(crate) fn bandit_weights(&self) -> Option<Vec<f64>> {
        let state = self
            .bandit_state
            .as_ref()
            .filter(|_| self.mode == Mode::Bandit)?;
        if let Some(w) = &state.winner {
            return Some(
                self.variants
                    .iter()
                    .map(|v| f64::from(u8::from(v.id == w.variant)))
                    .collect(),
            );
        }
        let last = state.periods.last()?;
        (last.weights.len() == self.variants.len()).then(|| last.weights.clone())
    }

    pub(crate) fn validate_bandit(&self) -> Result<(), Invalid> {
        let bad = |m: String| Err(Invalid(format!("experiment '{}': {m}", self.name)));
        if self.mode == Mode::Fixed {
            if self.decision_metric.is_some() || self.bandit.is_some() {
                return bad("decision_metric and [bandit] need mode = \"bandit\"".into());
            }
            return Ok(());
        }
        match &self.decision_metric {
            None => return bad("mode = \"bandit\" needs a decision_metric".into()),
            Some(m) if AUTOMATIC_METRICS.contains(&m.as_str()) => {
                return bad(format!(
                    "decision_metric '{m}': a bandit decides on outcome events (POST \
                     /v1/experiments/NAME/events), not on automatic metrics"
                ))
            }
            Some(_) => {}
        }
        let s = self.bandit.unwrap_or_default();
        let arms = self.variants.len() as f64;
        if !(s.floor >= 0.0 && s.floor * arms < 1.0) {
            return bad(format!("bandit floor {} must be in [0, 1/{arms})", s.floor));
        }
        if !(s.update_seconds.is_finite() && s.update_seconds > 0.0) {
            return bad(format!(
                "bandit update_seconds {} must be > 0",
                s.update_seconds
            ));
        }
        if s.exploration_units < 2 {
            return bad("bandit exploration_units must be at least 2".into());
        }
        Ok(())
    }
}
