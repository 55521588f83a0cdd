//! Ratio metrics (e.g. output tokens per success, cost per conversion) by the delta method, as
//! GrowthBook's `RatioStatistic`: the unit is the unit of randomization, each unit contributes a
//! numerator x and a denominator y (its sums of the two metrics), and the ratio of means
//! x̄ / ȳ has the per-unit variance
//!
//! ```text
//! var = v_x / ȳ² − 2 c_xy x̄ / ȳ³ + x̄² v_y / ȳ⁴      (v, c with n − 1)
//! ```
//!
//! so a ratio becomes a [`Summary`] (n units, mean x̄/ȳ, sd √var) and every comparison of means
//! (Welch, sequential, Bayesian) applies unchanged. Checked against gbstats on fixtures.

use serde::{Deserialize, Serialize};

use crate::stats::{from_moments, Summary};

/// The aggregates of one variant's units for a ratio metric: sums of x and y per unit, taken
/// about their means (what the database computes in two passes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatioMoments {
    pub n: usize,
    pub numerator_mean: f64,
    pub denominator_mean: f64,
    /// Σ (x − x̄)²
    pub numerator_m2: f64,
    /// Σ (y − ȳ)²
    pub denominator_m2: f64,
    /// Σ (x − x̄)(y − ȳ)
    pub co_moment: f64,
}

impl RatioMoments {
    /// From per-unit (x, y) pairs.
    pub fn of(pairs: &[(f64, f64)]) -> RatioMoments {
        let n = pairs.len();
        let mx = pairs.iter().map(|p| p.0).sum::<f64>() / n.max(1) as f64;
        let my = pairs.iter().map(|p| p.1).sum::<f64>() / n.max(1) as f64;
        RatioMoments {
            n,
            numerator_mean: mx,
            denominator_mean: my,
            numerator_m2: pairs.iter().map(|p| (p.0 - mx).powi(2)).sum(),
            denominator_m2: pairs.iter().map(|p| (p.1 - my).powi(2)).sum(),
            co_moment: pairs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum(),
        }
    }

    /// The ratio x̄/ȳ as a summary with the delta method's standard deviation; an empty summary
    /// (n = 0) when there are no units, NaNs when the denominator's mean is 0.
    pub fn summary(&self) -> Summary {
        if self.n == 0 {
            return from_moments(0, f64::NAN, f64::NAN);
        }
        let (x, y) = (self.numerator_mean, self.denominator_mean);
        if y == 0.0 {
            return from_moments(self.n, f64::NAN, f64::NAN);
        }
        let d = (self.n.max(2) - 1) as f64;
        let (vx, vy, cxy) = (
            self.numerator_m2 / d,
            self.denominator_m2 / d,
            self.co_moment / d,
        );
        let var = vx / y.powi(2) - 2.0 * cxy * x / y.powi(3) + x.powi(2) * vy / y.powi(4);
        // from_moments takes Σ squared deviations = var · (n − 1)
        from_moments(self.n, x / y, var.max(0.0) * (self.n as f64 - 1.0))
    }
}
