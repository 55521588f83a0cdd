//! Statistics for experiment results: per-variant summaries, Welch's t-test against control,
//! a Gaussian chance to beat control, and the sample-ratio-mismatch check. Distributions come
//! from `statrs`; the numbers are checked against scipy on committed fixtures.

use serde::Serialize;
use statrs::distribution::{ChiSquared, ContinuousCDF, Normal, StudentsT};

/// The level of every interval and test: 95%.
pub const ALPHA: f64 = 0.05;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Summary {
    pub n: usize,
    #[schema(value_type = Option<f64>)]
    pub mean: f64,
    /// Sample standard deviation (n − 1).
    #[schema(value_type = Option<f64>)]
    pub sd: f64,
    /// 95% confidence interval of the mean (Student's t).
    #[schema(value_type = Option<f64>)]
    pub ci_low: f64,
    #[schema(value_type = Option<f64>)]
    pub ci_high: f64,
}

pub fn summarize(xs: &[f64]) -> Summary {
    let n = xs.len();
    if n == 0 {
        return from_moments(0, f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    from_moments(n, mean, xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>())
}

/// The summary of `n` values from their mean and their sum of squared deviations from it
/// (what a database computes with two aggregations, without sending the values).
pub fn from_moments(n: usize, mean: f64, squared_deviations: f64) -> Summary {
    if n == 0 {
        return Summary {
            n,
            mean: f64::NAN,
            sd: f64::NAN,
            ci_low: f64::NAN,
            ci_high: f64::NAN,
        };
    }
    let var = if n > 1 {
        squared_deviations.max(0.0) / (n - 1) as f64
    } else {
        f64::NAN
    };
    let sd = var.sqrt();
    let half = if n > 1 {
        t_quantile(0.975, (n - 1) as f64) * sd / (n as f64).sqrt()
    } else {
        f64::NAN
    };
    Summary {
        n,
        mean,
        sd,
        ci_low: mean - half,
        ci_high: mean + half,
    }
}

fn t_quantile(p: f64, df: f64) -> f64 {
    StudentsT::new(0.0, 1.0, df)
        .map(|t| t.inverse_cdf(p))
        .unwrap_or(f64::NAN)
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Comparison {
    /// treatment mean − control mean
    #[schema(value_type = Option<f64>)]
    pub diff: f64,
    /// diff / control mean
    #[schema(value_type = Option<f64>)]
    pub relative_lift: f64,
    #[schema(value_type = Option<f64>)]
    pub t: f64,
    #[schema(value_type = Option<f64>)]
    pub df: f64,
    /// Two-sided Welch's t-test p-value (scipy.stats.ttest_ind(equal_var=False)).
    #[schema(value_type = Option<f64>)]
    pub p_value: f64,
    /// 95% confidence interval of `diff` (Welch–Satterthwaite degrees of freedom).
    #[schema(value_type = Option<f64>)]
    pub ci_low: f64,
    #[schema(value_type = Option<f64>)]
    pub ci_high: f64,
    /// P(treatment mean > control mean) under a Gaussian approximation of the difference.
    #[schema(value_type = Option<f64>)]
    pub chance_to_beat_control: f64,
}

pub fn welch(control: &[f64], treatment: &[f64]) -> Option<Comparison> {
    welch_summaries(&summarize(control), &summarize(treatment))
}

/// Welch's test from the two groups' summaries.
pub fn welch_summaries(c: &Summary, t: &Summary) -> Option<Comparison> {
    if c.n < 2 || t.n < 2 {
        return None;
    }
    let vc = c.sd.powi(2) / c.n as f64;
    let vt = t.sd.powi(2) / t.n as f64;
    let se = (vc + vt).sqrt();
    let diff = t.mean - c.mean;
    if se == 0.0 {
        return None;
    }
    let df = (vc + vt).powi(2) / (vc.powi(2) / (c.n - 1) as f64 + vt.powi(2) / (t.n - 1) as f64);
    let stat = diff / se;
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    let p_value = 2.0 * (1.0 - dist.cdf(stat.abs()));
    let q = dist.inverse_cdf(0.975);
    let normal = Normal::new(0.0, 1.0).ok()?;
    Some(Comparison {
        diff,
        relative_lift: if c.mean != 0.0 {
            diff / c.mean
        } else {
            f64::NAN
        },
        t: stat,
        df,
        p_value,
        ci_low: diff - q * se,
        ci_high: diff + q * se,
        chance_to_beat_control: normal.cdf(stat),
    })
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SrmCheck {
    #[schema(value_type = Option<f64>)]
    pub chi2: f64,
    #[schema(value_type = Option<f64>)]
    pub p_value: f64,
    /// Flagged when p < 0.001.
    pub mismatch: bool,
}

/// Chi-squared goodness of fit of observed units per variant against the expected weights
/// (scipy.stats.chisquare with f_exp = total × weight).
pub fn srm(observed: &[u64], weights: &[f64]) -> Option<SrmCheck> {
    let total: u64 = observed.iter().sum();
    let wsum: f64 = weights.iter().sum();
    if observed.len() < 2 || observed.len() != weights.len() || total == 0 || wsum <= 0.0 {
        return None;
    }
    let mut chi2 = 0.0;
    for (&o, &w) in observed.iter().zip(weights) {
        let e = total as f64 * w / wsum;
        if e > 0.0 {
            chi2 += (o as f64 - e).powi(2) / e;
        }
    }
    let dist = ChiSquared::new((observed.len() - 1) as f64).ok()?;
    let p_value = 1.0 - dist.cdf(chi2);
    Some(SrmCheck {
        chi2,
        p_value,
        mismatch: p_value < 0.001,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal as RNormal};

    #[test]
    fn aa_false_positive_rate_is_calibrated() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2026);
        let d = RNormal::new(10.0, 3.0).unwrap();
        let mut positives = 0;
        for _ in 0..1000 {
            let a: Vec<f64> = (0..100).map(|_| d.sample(&mut rng)).collect();
            let b: Vec<f64> = (0..100).map(|_| d.sample(&mut rng)).collect();
            if welch(&a, &b).unwrap().p_value < 0.05 {
                positives += 1;
            }
        }
        let rate = positives as f64 / 1000.0;
        assert!((0.03..=0.07).contains(&rate), "false-positive rate {rate}");
    }

    #[test]
    fn a_real_effect_is_detected() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let a: Vec<f64> = (0..200)
            .map(|_| RNormal::new(10.0, 3.0).unwrap().sample(&mut rng))
            .collect();
        let b: Vec<f64> = (0..200)
            .map(|_| RNormal::new(11.5, 3.0).unwrap().sample(&mut rng))
            .collect();
        let c = welch(&a, &b).unwrap();
        assert!(c.p_value < 0.001 && c.diff > 0.0 && c.chance_to_beat_control > 0.99);
        assert!(c.ci_low > 0.0);
    }

    #[test]
    fn srm_flags_a_skewed_split() {
        assert!(!srm(&[5000, 5050], &[0.5, 0.5]).unwrap().mismatch);
        assert!(srm(&[5000, 5600], &[0.5, 0.5]).unwrap().mismatch);
        assert!(!srm(&[2000, 3000, 5000], &[0.2, 0.3, 0.5]).unwrap().mismatch);
    }
}
