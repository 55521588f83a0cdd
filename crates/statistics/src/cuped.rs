//! CUPED (regression adjustment with a pre-exposure covariate), as GrowthBook's stats engine
//! does it (`RegressionAdjustedStatistic`, `compute_theta`), so the numbers equal gbstats'.
//!
//! Each unit has its post-exposure value `y` of a metric and its pre-exposure value `x` of the
//! same metric (its events in the lookback window before its first exposure; 0 without any).
//! For a control/treatment pair, θ is the slope of `y` on `x` over both groups pooled:
//!
//! ```text
//! θ = cov(x, y) / var(x)                      (pooled, around the pooled means)
//! adjusted mean     = ȳ − θ x̄                 (per group)
//! adjusted variance = var(y) + θ² var(x) − 2θ cov(x, y)
//! ```
//!
//! The difference of adjusted means estimates the same effect as the difference of raw means
//! (randomisation makes the groups' x̄ equal in expectation), with the variance `y` shares with
//! `x` removed: the variance reduction is 1 − (adjusted variance of the difference) /
//! (unadjusted variance of the difference), reported with each comparison. As in gbstats, a pair
//! without variance in `x` or `y` is not adjusted (θ = 0). Binary metrics use a proportion's
//! variance p(1 − p) for `x` and `y` (gbstats' `ProportionStatistic`).

use serde::Serialize;

use crate::bayes::{bayesian_scaled, Bayesian};
use crate::sequential::{sequential, Sequential};
use crate::stats::{from_moments, welch_summaries, Comparison, Summary};

/// One group's sums over its units' (pre, post) values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrePost {
    pub n: usize,
    pub post_sum: f64,
    pub post_squares: f64,
    pub pre_sum: f64,
    pub pre_squares: f64,
    /// Σ post × pre.
    pub products: f64,
    /// Binary values: variances are p(1 − p).
    pub proportion: bool,
}

impl PrePost {
    /// The sums of units' `(pre, post)` values.
    pub fn of(units: &[(f64, f64)], proportion: bool) -> PrePost {
        let mut m = PrePost {
            proportion,
            ..PrePost::default()
        };
        for &(x, y) in units {
            m.n += 1;
            m.post_sum += y;
            m.post_squares += y * y;
            m.pre_sum += x;
            m.pre_squares += x * x;
            m.products += x * y;
        }
        m
    }

    fn joint(&self, o: &PrePost) -> PrePost {
        PrePost {
            n: self.n + o.n,
            post_sum: self.post_sum + o.post_sum,
            post_squares: self.post_squares + o.post_squares,
            pre_sum: self.pre_sum + o.pre_sum,
            pre_squares: self.pre_squares + o.pre_squares,
            products: self.products + o.products,
            proportion: self.proportion,
        }
    }

    fn n(&self) -> f64 {
        self.n as f64
    }

    fn variance(&self, sum: f64, squares: f64) -> f64 {
        if self.n <= 1 {
            return 0.0;
        }
        if self.proportion {
            let p = sum / self.n();
            return p * (1.0 - p);
        }
        (squares - sum * sum / self.n()) / (self.n() - 1.0)
    }

    pub fn post_mean(&self) -> f64 {
        self.post_sum / self.n()
    }

    pub fn pre_mean(&self) -> f64 {
        self.pre_sum / self.n()
    }

    pub fn post_variance(&self) -> f64 {
        self.variance(self.post_sum, self.post_squares)
    }

    pub fn pre_variance(&self) -> f64 {
        self.variance(self.pre_sum, self.pre_squares)
    }

    pub fn covariance(&self) -> f64 {
        if self.n <= 1 {
            return 0.0;
        }
        (self.products - self.post_sum * self.pre_sum / self.n()) / (self.n() - 1.0)
    }

    /// The adjusted summary with slope `theta`: mean ȳ − θx̄, its variance as above.
    fn adjusted(&self, theta: f64) -> Summary {
        let var = self.post_variance() + theta * theta * self.pre_variance()
            - 2.0 * theta * self.covariance();
        let mean = self.post_mean() - theta * self.pre_mean();
        from_moments(self.n, mean, var.max(0.0) * (self.n() - 1.0))
    }

    fn unadjusted(&self) -> Summary {
        from_moments(
            self.n,
            self.post_mean(),
            self.post_variance() * (self.n() - 1.0),
        )
    }
}

/// θ of a control/treatment pair over both groups pooled (0 where either pooled variance is 0).
pub fn theta(c: &PrePost, t: &PrePost) -> f64 {
    let j = c.joint(t);
    let (vx, vy) = (j.pre_variance(), j.post_variance());
    if vx == 0.0 || vy == 0.0 || !vx.is_finite() || !vy.is_finite() {
        return 0.0;
    }
    j.covariance() / vx
}

/// A treatment's CUPED read-out against control, beside the unadjusted one.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Cuped {
    #[schema(value_type = Option<f64>)]
    pub theta: f64,
    /// Mean pre-exposure value of the treatment's and the control's units.
    #[schema(value_type = Option<f64>)]
    pub pre_mean: f64,
    #[schema(value_type = Option<f64>)]
    pub control_pre_mean: f64,
    /// Adjusted means ȳ − θx̄ of the treatment and the control.
    #[schema(value_type = Option<f64>)]
    pub mean: f64,
    #[schema(value_type = Option<f64>)]
    pub control_mean: f64,
    /// 1 − adjusted / unadjusted variance of the difference of means.
    #[schema(value_type = Option<f64>)]
    pub variance_reduction: f64,
    /// Welch's test and the always-valid sequence on the adjusted means.
    pub vs_control: Option<Comparison>,
    pub sequential: Option<Sequential>,
    /// GrowthBook's Bayesian read-out on the adjusted means (relative to unadjusted means).
    pub bayesian: Option<Bayesian>,
}

/// The CUPED comparison of treatment `t` with control `c` (`None` with fewer than 2 units in
/// either).
pub fn cuped(c: &PrePost, t: &PrePost, alpha: f64, tuning: f64) -> Option<Cuped> {
    if c.n < 2 || t.n < 2 {
        return None;
    }
    let theta = theta(c, t);
    let (ca, ta) = (c.adjusted(theta), t.adjusted(theta));
    let (cu, tu) = (c.unadjusted(), t.unadjusted());
    let var = |c: &Summary, t: &Summary| c.sd.powi(2) / c.n as f64 + t.sd.powi(2) / t.n as f64;
    let before = var(&cu, &tu);
    Some(Cuped {
        theta,
        pre_mean: t.pre_mean(),
        control_pre_mean: c.pre_mean(),
        mean: ta.mean,
        control_mean: ca.mean,
        variance_reduction: if before > 0.0 {
            1.0 - var(&ca, &ta) / before
        } else {
            0.0
        },
        vs_control: welch_summaries(&ca, &ta),
        sequential: sequential(&ca, &ta, alpha, tuning),
        bayesian: bayesian_scaled(&ca, &ta, (cu.mean, tu.mean), alpha),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_covariate_nothing_changes_and_a_perfect_one_removes_the_variance() {
        let c = PrePost::of(&[(0.0, 1.0), (0.0, 3.0), (0.0, 2.0)], false);
        let t = PrePost::of(&[(0.0, 2.0), (0.0, 4.0), (0.0, 3.0)], false);
        let r = cuped(&c, &t, 0.05, 100.0).unwrap();
        assert_eq!(r.theta, 0.0);
        assert_eq!(r.variance_reduction, 0.0);
        assert_eq!(r.mean, 3.0);
        // y = x + effect: the adjusted variance is 0 within groups
        let c = PrePost::of(&[(1.0, 1.0), (3.0, 3.0), (2.0, 2.0)], false);
        let t = PrePost::of(&[(1.0, 2.0), (3.0, 4.0), (2.0, 3.0)], false);
        let r = cuped(&c, &t, 0.05, 100.0).unwrap();
        assert!(r.variance_reduction > 0.8, "{r:?}");
    }
}
