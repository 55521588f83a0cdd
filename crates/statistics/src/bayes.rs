//! GrowthBook's Bayesian read-out of a variant against control (`gbstats`'
//! `EffectBayesianABTest`, relative effect, its default flat prior): the posterior of the
//! relative uplift (treatment − control) / control is Normal with the delta-method mean and
//! variance below, and from it
//!
//! - **chance to beat control**: P(uplift > 0);
//! - the (1 − α) **credible interval** of the uplift;
//! - **risk** (expected loss), per choice: choosing control loses E[max(uplift, 0)], choosing
//!   the treatment loses E[max(−uplift, 0)], both relative to control's mean.
//!
//! ```text
//! uplift mean     = (m_t − m_c) / m_c
//! uplift variance = v_t / (m_c² n_t) + v_c m_t² / (m_c⁴ n_c)
//! ```
//!
//! Checked against gbstats on committed fixtures. "Higher is better" here; a metric defined with
//! `direction = "lower"` gets 1 − the chance and the two risks swapped in the results
//! (`store/results.rs`), as GrowthBook does for inverse metrics.

use serde::Serialize;
use statrs::distribution::{Continuous, ContinuousCDF, Normal};

use crate::stats::Summary;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Bayesian {
    /// P(treatment's mean > control's mean).
    #[schema(value_type = Option<f64>)]
    pub chance_to_beat_control: f64,
    /// Posterior mean of the relative uplift (treatment − control) / control.
    #[schema(value_type = Option<f64>)]
    pub uplift: f64,
    #[schema(value_type = Option<f64>)]
    pub uplift_sd: f64,
    /// (1 − α) credible interval of the relative uplift.
    #[schema(value_type = Option<f64>)]
    pub ci_low: f64,
    #[schema(value_type = Option<f64>)]
    pub ci_high: f64,
    /// Expected relative loss of shipping control (what the treatment would have gained).
    #[schema(value_type = Option<f64>)]
    pub risk_control: f64,
    /// Expected relative loss of shipping the treatment.
    #[schema(value_type = Option<f64>)]
    pub risk_treatment: f64,
}

/// `None` without units and variance in both groups, or when control's mean is 0 (a relative
/// uplift is then undefined).
pub fn bayesian(c: &Summary, t: &Summary, alpha: f64) -> Option<Bayesian> {
    bayesian_scaled(c, t, (c.mean, t.mean), alpha)
}

/// The same read-out where the relative uplift is scaled by other means than the summaries':
/// a regression-adjusted (CUPED) estimate is relative to the unadjusted means (control's,
/// treatment's), as gbstats scales it.
pub fn bayesian_scaled(
    c: &Summary,
    t: &Summary,
    (mc, mt): (f64, f64),
    alpha: f64,
) -> Option<Bayesian> {
    if c.n < 2 || t.n < 2 || mc == 0.0 || !mc.is_finite() || !t.mean.is_finite() {
        return None;
    }
    let (vc, vt) = (c.sd.powi(2), t.sd.powi(2));
    if !(vc > 0.0 && vt > 0.0) {
        return None;
    }
    let mu = (t.mean - c.mean) / mc;
    let var = vt / (mc.powi(2) * t.n as f64) + vc * mt.powi(2) / (mc.powi(4) * c.n as f64);
    let s = var.sqrt();
    let z = Normal::new(0.0, 1.0).ok()?;
    let q = z.inverse_cdf(1.0 - alpha / 2.0);
    let k = mu / s;
    // E[max(X, 0)] and E[max(−X, 0)] of X ~ N(mu, s²), in closed form
    let gain = mu * z.cdf(k) + s * z.pdf(k);
    let loss = s * z.pdf(k) - mu * z.cdf(-k);
    Some(Bayesian {
        chance_to_beat_control: z.cdf(k),
        uplift: mu,
        uplift_sd: s,
        ci_low: mu - q * s,
        ci_high: mu + q * s,
        risk_control: gain,
        risk_treatment: loss,
    })
}
