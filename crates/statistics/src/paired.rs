//! Statistics for paired samples: every variant of an offline evaluation answers the same
//! inputs, so comparisons against control are made row by row. Continuous scores use the paired
//! t-test (scipy.stats.ttest_rel), pass/fail scores McNemar's exact test (statsmodels
//! `mcnemar(exact=True)`), and judge preferences the sign test (an exact binomial on wins vs
//! losses, ties dropped). Checked against scipy/statsmodels on committed fixtures.

use serde::Serialize;
use statrs::distribution::{Binomial, ContinuousCDF, DiscreteCDF, StudentsT};

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PairedT {
    /// Number of pairs.
    pub n: usize,
    /// Mean of treatment − control over the pairs.
    pub diff: f64,
    pub t: f64,
    pub df: f64,
    pub p_value: f64,
    /// 95% confidence interval of `diff`.
    pub ci_low: f64,
    pub ci_high: f64,
}

/// Paired t-test of `treatment − control`; `None` with fewer than two pairs or no variation
/// in the differences (scipy answers NaN there).
pub fn paired_t(control: &[f64], treatment: &[f64]) -> Option<PairedT> {
    assert_eq!(
        control.len(),
        treatment.len(),
        "paired samples have equal length"
    );
    let n = control.len();
    if n < 2 {
        return None;
    }
    let d: Vec<f64> = treatment.iter().zip(control).map(|(t, c)| t - c).collect();
    let mean = d.iter().sum::<f64>() / n as f64;
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let se = (var / n as f64).sqrt();
    if se == 0.0 || !se.is_finite() {
        return None;
    }
    let df = (n - 1) as f64;
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    let t = mean / se;
    let q = dist.inverse_cdf(0.975);
    Some(PairedT {
        n,
        diff: mean,
        t,
        df,
        p_value: 2.0 * (1.0 - dist.cdf(t.abs())),
        ci_low: mean - q * se,
        ci_high: mean + q * se,
    })
}

/// Two-sided exact binomial test of `k` successes in `n` trials at p = 0.5: twice the smaller
/// tail, capped at 1 (what scipy's `binomtest` and statsmodels' exact McNemar give for p = 0.5).
pub fn binomial_two_sided(k: u64, n: u64) -> f64 {
    if n == 0 {
        return 1.0;
    }
    let b = Binomial::new(0.5, n).expect("p = 0.5 is valid");
    let small = k.min(n - k);
    (2.0 * b.cdf(small)).min(1.0)
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct McNemar {
    pub n: usize,
    /// Pairs where control passed and treatment failed.
    pub control_only: u64,
    /// Pairs where treatment passed and control failed.
    pub treatment_only: u64,
    /// Difference of pass rates, treatment − control.
    pub diff: f64,
    pub p_value: f64,
}

/// McNemar's exact test on paired pass/fail outcomes.
pub fn mcnemar(control: &[bool], treatment: &[bool]) -> McNemar {
    assert_eq!(
        control.len(),
        treatment.len(),
        "paired samples have equal length"
    );
    let control_only = control
        .iter()
        .zip(treatment)
        .filter(|(c, t)| **c && !**t)
        .count() as u64;
    let treatment_only = control
        .iter()
        .zip(treatment)
        .filter(|(c, t)| !**c && **t)
        .count() as u64;
    let n = control.len();
    let diff = if n == 0 {
        f64::NAN
    } else {
        (treatment_only as f64 - control_only as f64) / n as f64
    };
    McNemar {
        n,
        control_only,
        treatment_only,
        diff,
        p_value: binomial_two_sided(control_only, control_only + treatment_only),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SignTest {
    pub wins: u64,
    pub losses: u64,
    pub ties: u64,
    /// wins / (wins + losses); NaN when every comparison tied.
    pub win_rate: f64,
    pub p_value: f64,
}

/// Sign test of wins against losses (ties dropped).
pub fn sign_test(wins: u64, losses: u64, ties: u64) -> SignTest {
    let decided = wins + losses;
    SignTest {
        wins,
        losses,
        ties,
        win_rate: if decided == 0 {
            f64::NAN
        } else {
            wins as f64 / decided as f64
        },
        p_value: binomial_two_sided(wins, decided),
    }
}

/// Empirical quantile with linear interpolation between order statistics (numpy's default).
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    quantiles(xs, &[q])[0]
}

/// Several quantiles of one sample, sorting it once; NaN for an empty sample.
pub fn quantiles(xs: &[f64], qs: &[f64]) -> Vec<f64> {
    if xs.is_empty() {
        return vec![f64::NAN; qs.len()];
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    qs.iter()
        .map(|q| {
            let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_cases_by_hand() {
        // 3 discordant pairs all one way: p = 2 * 0.5^3
        let m = mcnemar(&[true, true, true, false], &[false, false, false, false]);
        assert_eq!((m.control_only, m.treatment_only), (3, 0));
        assert!((m.p_value - 0.25).abs() < 1e-12);
        assert_eq!(sign_test(0, 0, 4).p_value, 1.0);
        assert!(
            paired_t(&[1.0, 2.0], &[2.0, 3.0]).is_none(),
            "constant differences have no variance"
        );
        assert_eq!(quantile(&[4.0, 1.0, 3.0, 2.0], 0.5), 2.5);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.95), 4.8);
        assert_eq!(
            quantiles(&[5.0, 1.0, 3.0, 2.0, 4.0], &[0.0, 0.5, 1.0]),
            vec![1.0, 3.0, 5.0]
        );
    }
}
