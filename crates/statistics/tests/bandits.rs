//! Bandits (`bandit.rs`), simulated through the statistics code with fixed seeds: units arrive
//! in batches, each batch assigned with the current weights (one period), then the estimates,
//! the stopping rule and the weights are updated.
//!
//! - 5 arms, one better by 0.2 sd: the bandit sends it more traffic than uniform allocation
//!   (regret against uniform's) and stops naming it in ≥ 90% of runs;
//! - A/A (5 equal arms): a winner is named in ≤ 5% of runs;
//! - a drift in the traffic over time while the weights move: the period-weighted estimates
//!   cover the truth (each arm's mean over the same mix of periods) at their level, where
//!   pooling an arm's units over periods does not (Simpson's paradox).

use abserve_statistics::bandit::{estimates, weights, winner, Cell, Settings};
use abserve_statistics::Direction;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

const SETTINGS: Settings = Settings {
    exploration_units: 100,
    floor: 0.02,
};

struct Outcome {
    winner: Option<usize>,
    units: u64,
    /// Units per arm.
    allocation: Vec<u64>,
}

/// One bandit run: arm k's values ~ N(means[k] + drift(period), 1), `batch` units per period,
/// up to `horizon` units.
fn run(
    means: &[f64],
    drift: impl Fn(usize) -> f64,
    batch: u64,
    horizon: u64,
    seed: u64,
) -> (Outcome, Vec<Vec<Cell>>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let noise = Normal::new(0.0, 1.0).unwrap();
    let arms = means.len();
    let mut w = vec![1.0 / arms as f64; arms];
    let mut cells: Vec<Vec<Cell>> = vec![];
    let mut allocation = vec![0u64; arms];
    let mut units = 0;
    while units < horizon {
        let p = cells.len();
        let mut period = vec![Cell::default(); arms];
        for _ in 0..batch {
            let mut r: f64 = rng.gen();
            let mut k = 0;
            while k + 1 < arms && r >= w[k] {
                r -= w[k];
                k += 1;
            }
            period[k].add(means[k] + drift(p) + noise.sample(&mut rng));
            allocation[k] += 1;
        }
        units += batch;
        cells.push(period);
        let est = estimates(&cells);
        if est.iter().all(|e| e.units >= SETTINGS.exploration_units) {
            if let Some(win) = winner(&est, Direction::Higher, 0.05, 5000.0) {
                return (
                    Outcome {
                        winner: Some(win.arm),
                        units,
                        allocation,
                    },
                    cells,
                );
            }
        }
        w = weights(&est, Direction::Higher, &SETTINGS);
    }
    (
        Outcome {
            winner: None,
            units,
            allocation,
        },
        cells,
    )
}

#[test]
fn the_bandit_favours_and_names_the_best_arm() {
    let means = [0.0, 0.0, 0.0, 0.0, 0.2];
    let runs = 200;
    let (mut named, mut regret, mut uniform, mut units) = (0, 0.0, 0.0, vec![]);
    let mut best_share = vec![];
    for seed in 0..runs {
        let (o, _) = run(&means, |_| 0.0, 200, 40_000, seed);
        named += (o.winner == Some(4)) as usize;
        // regret: what the units lost against always the best arm
        regret += o
            .allocation
            .iter()
            .zip(&means)
            .map(|(&n, m)| n as f64 * (0.2 - m))
            .sum::<f64>();
        uniform += o.units as f64 * 0.2 * 4.0 / 5.0;
        best_share.push(o.allocation[4] as f64 / o.units as f64);
        units.push(o.units);
    }
    units.sort();
    best_share.sort_by(f64::total_cmp);
    let named = named as f64 / runs as f64;
    eprintln!(
        "bandit, 5 arms, best +0.2 sd: named the best in {named:.3} of {runs} runs; median units \
         to stop {}; median share of units on the best arm {:.3} (uniform 0.200); regret {:.3} \
         of uniform allocation's over the same units",
        units[runs as usize / 2],
        best_share[runs as usize / 2],
        regret / uniform
    );
    assert!(named >= 0.9, "named the best arm in {named}");
    assert!(regret < uniform, "regret {regret} vs uniform {uniform}");
    assert!(best_share[runs as usize / 2] > 0.2);
}

#[test]
fn an_aa_bandit_rarely_names_a_winner() {
    let runs = 200;
    let mut named = 0;
    for seed in 0..runs {
        let (o, _) = run(&[0.0; 5], |_| 0.0, 200, 40_000, 10_000 + seed);
        named += o.winner.is_some() as usize;
    }
    let rate = named as f64 / runs as f64;
    eprintln!("bandit, A/A with 5 arms up to 40,000 units: a winner in {rate:.3} of {runs} runs");
    assert!(rate <= 0.05, "A/A winners {rate}");
}

#[test]
fn period_weighted_estimates_stay_unbiased_when_traffic_drifts_and_weights_move() {
    // the traffic's level rises by 0.05 sd per period while the bandit moves units to arm 2
    let means = [0.0, 0.05, 0.15];
    let drift = |p: usize| 0.05 * p as f64;
    let runs = 2000;
    let (mut covered, mut naive_covered) = (0, 0);
    for seed in 0..runs {
        let (_, cells) = run(&means, drift, 200, 6_000, 50_000 + seed);
        let est = estimates(&cells);
        let total: u64 = cells.iter().flatten().map(|c| c.n).sum();
        // the truth: each arm's mean over the periods, weighed by their share of all units
        let mix: f64 = cells
            .iter()
            .enumerate()
            .map(|(p, period)| {
                period.iter().map(|c| c.n).sum::<u64>() as f64 / total as f64 * drift(p)
            })
            .sum();
        let k = 2;
        let truth = means[k] + mix;
        let half = 1.96 * est[k].variance.sqrt();
        covered += ((est[k].mean - truth).abs() <= half) as usize;
        // pooling arm 2's units over periods weighs its (later, higher) periods more
        let (n, s) = cells
            .iter()
            .fold((0u64, 0.0), |(n, s), p| (n + p[k].n, s + p[k].sum));
        naive_covered += ((s / n as f64 - truth).abs() <= half) as usize;
    }
    let (rate, naive) = (
        covered as f64 / runs as f64,
        naive_covered as f64 / runs as f64,
    );
    eprintln!(
        "bandit under drift: 95% intervals of the period-weighted estimate cover the truth in \
         {rate:.3} of {runs} runs; pooled over periods: {naive:.3}"
    );
    // at their level up to the simulation's noise (two binomial standard errors)
    assert!(
        rate >= 0.95 - 2.0 * (0.05f64 * 0.95 / runs as f64).sqrt(),
        "coverage {rate}"
    );
    assert!(naive < 0.5, "pooled coverage {naive}");
}
