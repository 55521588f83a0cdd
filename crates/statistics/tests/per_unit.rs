//! Why results are per unit (`store/results.rs`, `Analysis`): an A/A simulation through the
//! statistics code, with fixed seeds. Units send 1–30 requests each and carry a unit-level
//! effect (some users are slow, some verbose): the requests of one unit are correlated. Welch's
//! test over every request treats them as independent and its false-positive rate is inflated;
//! over one value per unit (the unit's mean, what the store computes by default) it stays at
//! the level.

use abserve_statistics::welch;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// One arm's requests, grouped by unit: unit effect ~ N(0, 1), request noise ~ N(0, 1).
fn arm(rng: &mut rand_chacha::ChaCha8Rng, units: usize) -> Vec<Vec<f64>> {
    let n01 = Normal::new(0.0, 1.0).unwrap();
    (0..units)
        .map(|_| {
            let effect = n01.sample(rng);
            let k = rng.gen_range(1..=30);
            (0..k)
                .map(|_| 100.0 + 10.0 * (effect + n01.sample(rng)))
                .collect()
        })
        .collect()
}

#[test]
fn per_request_tests_are_inflated_by_correlated_requests_and_per_unit_tests_are_not() {
    let runs = 2000;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(30);
    let (mut per_request, mut per_unit) = (0, 0);
    for _ in 0..runs {
        let (a, b) = (arm(&mut rng, 100), arm(&mut rng, 100));
        let flat = |x: &[Vec<f64>]| x.iter().flatten().copied().collect::<Vec<f64>>();
        let means = |x: &[Vec<f64>]| {
            x.iter()
                .map(|u| u.iter().sum::<f64>() / u.len() as f64)
                .collect::<Vec<f64>>()
        };
        if welch(&flat(&a), &flat(&b)).unwrap().p_value < 0.05 {
            per_request += 1;
        }
        if welch(&means(&a), &means(&b)).unwrap().p_value < 0.05 {
            per_unit += 1;
        }
    }
    let (fr, fu) = (
        per_request as f64 / runs as f64,
        per_unit as f64 / runs as f64,
    );
    eprintln!("A/A false-positive rate at alpha 0.05 over {runs} runs: per request {fr:.3}, per unit {fu:.3}");
    assert!(
        fr > 0.05,
        "the per-request test should be inflated, got {fr}"
    );
    // at the level within Monte Carlo error (3 standard errors of 2000 runs: 0.015)
    assert!(
        fu <= 0.05 + 3.0 * (0.05f64 * 0.95 / runs as f64).sqrt(),
        "per unit {fu}"
    );
}
