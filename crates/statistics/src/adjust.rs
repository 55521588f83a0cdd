//! Multiple comparisons: p-values adjusted across every variant × metric compared with control,
//! so that looking at many comparisons does not manufacture a winner. Equal to statsmodels'
//! `multipletests(method="holm")` and `multipletests(method="fdr_bh")` on committed fixtures.
//!
//! - **Holm–Bonferroni** controls the family-wise error rate (any false positive);
//! - **Benjamini–Hochberg** controls the false discovery rate (the share of false positives
//!   among the comparisons called significant).
//!
//! NaN p-values (comparisons that could not be made) are left NaN and not counted in m.

/// Holm's step-down adjustment: p_(i) · (m − i + 1), made monotone, capped at 1.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let order = sorted(p);
    let m = order.len();
    let mut out = vec![f64::NAN; p.len()];
    let mut running = 0.0f64;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max((p[i] * (m - rank) as f64).min(1.0));
        out[i] = running;
    }
    out
}

/// Benjamini–Hochberg's step-up adjustment: p_(i) · m / i, made monotone from the largest down,
/// capped at 1.
pub fn benjamini_hochberg(p: &[f64]) -> Vec<f64> {
    let order = sorted(p);
    let m = order.len();
    let mut out = vec![f64::NAN; p.len()];
    let mut running = 1.0f64;
    for (rank, &i) in order.iter().enumerate().rev() {
        running = running.min(p[i] * m as f64 / (rank + 1) as f64);
        out[i] = running;
    }
    out
}

/// Indices of the finite p-values, smallest first.
fn sorted(p: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..p.len()).filter(|&i| p[i].is_finite()).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_is_skipped_and_one_comparison_is_unchanged() {
        assert_eq!(holm(&[0.03]), vec![0.03]);
        assert_eq!(benjamini_hochberg(&[0.03]), vec![0.03]);
        let h = holm(&[0.01, f64::NAN, 0.04]);
        assert!(h[1].is_nan());
        assert_eq!((h[0], h[2]), (0.02, 0.04));
    }
}
