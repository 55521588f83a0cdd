//! The rules of an experiment's ratio metrics (`[[experiment.ratios]]`); their statistics are
//! `abserve_statistics::RatioMoments` (the delta method).

use crate::experiment::{Invalid, AUTOMATIC_METRICS};

impl crate::experiment::Experiment {
    /// Ratio metrics: well-formed names that repeat no metric's, a numerator that is not the
    /// denominator.
    pub(crate) fn validate_ratios(&self) -> Result<(), Invalid> {
        let bad = |m: String| Err(Invalid(format!("experiment '{}': {m}", self.name)));
        let mut ratio_names = std::collections::HashSet::new();
        for r in &self.ratios {
            let metric_name = |s: &str| {
                !s.is_empty()
                    && s.len() <= 64
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            };
            if !metric_name(&r.name) || !metric_name(&r.numerator) || !metric_name(&r.denominator) {
                return bad(format!(
                    "ratio '{}' ({} / {}): names must be 1-64 characters of letters, digits, '-', '_' or '.'",
                    r.name, r.numerator, r.denominator
                ));
            }
            if AUTOMATIC_METRICS.contains(&r.name.as_str()) || !ratio_names.insert(r.name.as_str())
            {
                return bad(format!("ratio '{}' repeats a metric's name", r.name));
            }
            if self.metrics.iter().any(|m| m.name == r.name) {
                return bad(format!("ratio '{}' repeats a metric's name", r.name));
            }
            if r.numerator == r.denominator {
                return bad(format!(
                    "ratio '{}' divides '{}' by itself",
                    r.name, r.numerator
                ));
            }
        }
        Ok(())
    }
}
