//! Always-valid inference for the difference of means against control: a confidence sequence
//! that may be looked at after every unit, as often as anyone likes, and still covers the true
//! difference with probability ≥ 1 − α at all times together.
//!
//! The boundary is the two-sided normal mixture of Howard, Ramdas, McAuliffe and Sekhon
//! ("Time-uniform, nonparametric, nonasymptotic confidence sequences", 2021), in the asymptotic
//! form of Waudby-Smith et al. 2023 (eq. 9) that GrowthBook's `gbstats`
//! (`SequentialTwoSidedTTest`) uses: with N = n_c + n_t units and V the variance of the
//! difference of means,
//!
//! ```text
//! half-width = sqrt(V·N) · sqrt( 2(Nρ² + 1) · ln( sqrt(Nρ² + 1) / α ) / (Nρ)² )
//! ρ          = sqrt( (−2 ln α + ln(−2 ln α + 1)) / tuning )
//! ```
//!
//! **Tuning** (`sequential_tuning` in an experiment, default [`DEFAULT_TUNING`] = 5000, as in
//! GrowthBook): the total number of units at which the sequence is narrowest relative to a
//! fixed-horizon interval. Set it near the number of units the experiment expects; the sequence
//! is valid for any value, only its width at a given N changes. The same boundary is
//! `confseq.boundaries.normal_mixture_bound(N, α, tuning, α, two-sided) / N` in σ units; the
//! fixtures check both.
//!
//! The always-valid p-value is 1/E with E the mixture's e-value (gbstats' eq. 155), capped at 1:
//! rejecting when it is below α at any look keeps the false-positive rate ≤ α.

use serde::Serialize;

use crate::stats::Summary;

/// GrowthBook's default tuning parameter: the total units at which the sequence is tightest.
pub const DEFAULT_TUNING: f64 = 5000.0;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Sequential {
    /// treatment mean − control mean
    #[schema(value_type = Option<f64>)]
    pub diff: f64,
    /// The (1 − α) confidence sequence of `diff` at the current number of units.
    #[schema(value_type = Option<f64>)]
    pub ci_low: f64,
    #[schema(value_type = Option<f64>)]
    pub ci_high: f64,
    /// Always-valid p-value (≤ α exactly when the sequence excludes 0, up to rounding).
    #[schema(value_type = Option<f64>)]
    pub p_value: f64,
}

fn rho(alpha: f64, tuning: f64) -> f64 {
    ((-2.0 * alpha.ln() + (-2.0 * alpha.ln() + 1.0).ln()) / tuning).sqrt()
}

/// The half-width of the confidence sequence for an estimate of variance `variance` after `n`
/// units in all.
pub fn half_width(variance: f64, n: f64, alpha: f64, tuning: f64) -> f64 {
    let r = rho(alpha, tuning);
    let nr2 = n * r * r;
    (variance * n).sqrt()
        * (2.0 * (nr2 + 1.0) * ((nr2 + 1.0).sqrt() / alpha).ln() / (n * r).powi(2)).sqrt()
}

/// The confidence sequence and always-valid p-value of treatment − control, from the two
/// groups' summaries; `None` without two units and some variance in each group.
pub fn sequential(c: &Summary, t: &Summary, alpha: f64, tuning: f64) -> Option<Sequential> {
    // (written so that NaN fails every check)
    let positive = |x: f64| x > 0.0;
    if c.n < 2 || t.n < 2 || !positive(tuning) || !(alpha > 0.0 && alpha < 1.0) {
        return None;
    }
    let variance = c.sd.powi(2) / c.n as f64 + t.sd.powi(2) / t.n as f64;
    if !positive(variance) {
        return None;
    }
    let n = (c.n + t.n) as f64;
    let diff = t.mean - c.mean;
    let w = half_width(variance, n, alpha, tuning);
    let r2 = rho(alpha, tuning).powi(2);
    let st2 = diff * diff * n / variance;
    let tr2p1 = n * r2 + 1.0;
    // 1/E computed in logs: E overflows for large effects
    let log_e = r2 * st2 / (2.0 * tr2p1) - 0.5 * tr2p1.ln();
    Some(Sequential {
        diff,
        ci_low: diff - w,
        ci_high: diff + w,
        p_value: (-log_e).exp().min(1.0),
    })
}
